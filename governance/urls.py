from django.urls import path

from . import approvals, attempts, bulk, chain, console, lists, remediation, views

app_name = "governance"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("queue/", views.queue, name="queue"),
    path("receipts/<int:pk>/", views.receipt, name="receipt"),
    path("queue/effect/<int:pk>/", views.effect, name="effect"),
    path("queue/delivery/<int:pk>/", views.delivery, name="delivery"),
    path("queue/execution/<int:pk>/", views.execution, name="execution"),
    path("queue/execution/<int:pk>/replay/", remediation.execution_replay, name="execution_replay"),
    path("queue/effect/<int:pk>/link/", remediation.effect_link, name="effect_link"),
    path("queue/effect/<int:pk>/remote-call/", remediation.effect_remote_call, name="effect_remote_call"),
    path("queue/lane/<int:pk>/", remediation.lane, name="lane"),
    path("attestations/", views.attestations, name="attestations"),
    path("attestations/certification/<int:pk>/", views.attestation, name="attestation"),
    path("attestations/approval/<int:pk>/", approvals.approval, name="approval"),
    path("attestations/request/", approvals.request_approval, name="request_approval"),
    path("board/", views.board, name="board"),
    path("bulk/", bulk.bulk, name="bulk"),  # issue 38 item 5: bulk remedies (D-490)
    path("cutover/", console.cutover, name="cutover"),
    path("cutover/succession/<int:pk>/", console.succession_view, name="succession"),
    path("cutover/attempt/<str:key>/", attempts.attempt_view, name="attempt"),
    # issue 38 item 2: lists outside the admin and the chain's pages (D-470, D-471)
    path("receipts/", lists.list_page, {"name": "receipts"}, name="receipts"),
    path("lanes/", lists.list_page, {"name": "lanes"}, name="lanes"),
    path("executions/", lists.list_page, {"name": "executions"}, name="executions"),
    path("effects/", lists.list_page, {"name": "effects"}, name="effects"),
    path("events/<int:pk>/", chain.event, name="event"),
    path("links/<int:pk>/", chain.link, name="link"),
]
