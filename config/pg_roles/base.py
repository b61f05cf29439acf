"""The test harness's PostgreSQL backend: Django's, plus the three things running the suite under the product's
database roles needs (docs/security.md "Database roles"; tests/dbroles.py switches the roles).

The suite connects as an administrator (the session user) and assumes roles with `SET ROLE` (Django's
`OPTIONS["assume_role"]`): the connector owner while the test databases are migrated, the application role
while a test body runs. Here:

- the maintenance connection (CREATE/DROP DATABASE, alias `__no_db__`) never assumes a role: the administrator
  creates and drops the test databases;
- a test database is created `OWNER` the role in `TEST["OWNER"]`, so the owner's migrations create (and own)
  every object in it;
- a flush between transactional tests (TRUNCATE of every table) runs as the session user with
  `session_replication_role = replica`, so the append-only tables' TRUNCATE guards let the harness reset them.
  Where the session user is no superuser (the application connecting directly) both SETs fail and nothing is
  truncated: the production roles never gain a way around the guards through this backend.
"""
from django.db import transaction
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base, creation, operations


class DatabaseCreation(creation.DatabaseCreation):
    def sql_table_creation_suffix(self):
        suffix = super().sql_table_creation_suffix()
        owner = self.connection.settings_dict["TEST"].get("OWNER")
        if not owner:
            return suffix
        return (suffix or "WITH") + f" OWNER {self._quote_name(owner)}"


class DatabaseOperations(operations.DatabaseOperations):
    def execute_sql_flush(self, sql_list):
        with transaction.atomic(using=self.connection.alias, savepoint=self.connection.features.can_rollback_ddl):
            with self.connection.cursor() as cursor:
                cursor.execute("SET LOCAL ROLE NONE")
                cursor.execute("SET LOCAL session_replication_role = replica")
                for sql in sql_list:
                    cursor.execute(sql)


class DatabaseWrapper(base.DatabaseWrapper):
    creation_class = DatabaseCreation
    ops_class = DatabaseOperations

    def _configure_role(self, connection):
        if self.alias == NO_DB_ALIAS:
            return False
        return super()._configure_role(connection)
