from django.urls import path

from . import approvals, attempts, console, views

app_name = "governance"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("queue/", views.queue, name="queue"),
    path("queue/effect/<int:pk>/", views.effect, name="effect"),
    path("queue/delivery/<int:pk>/", views.delivery, name="delivery"),
    path("queue/execution/<int:pk>/", views.execution, name="execution"),
    path("attestations/", views.attestations, name="attestations"),
    path("attestations/certification/<int:pk>/", views.attestation, name="attestation"),
    path("attestations/approval/<int:pk>/", approvals.approval, name="approval"),
    path("attestations/request/", approvals.request_approval, name="request_approval"),
    path("board/", views.board, name="board"),
    path("cutover/", console.cutover, name="cutover"),
    path("cutover/succession/<int:pk>/", console.succession_view, name="succession"),
    path("cutover/attempt/<str:key>/", attempts.attempt_view, name="attempt"),
]
