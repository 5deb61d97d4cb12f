# FSDP_CHECK_SQLITE: event traces are SQLite databases.
AC_DEFUN([FSDP_CHECK_SQLITE], [
    PKG_CHECK_MODULES([SQLITE], [sqlite3 >= 3.7.0], [],
        [AC_MSG_ERROR([SQLite 3 is required: install libsqlite3-dev (./bootstrap does it)])])
])
