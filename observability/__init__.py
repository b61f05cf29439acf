"""See the engine run (issue 21): health endpoints and Prometheus metrics, read from PostgreSQL at request time.

Sits on top like the operator screens: it reads the apps' models and the closed reason map, and no app imports it
(import-linter). It owns no table, so it is not an installed app."""
