# FSDP_CHECK_CUNIT: the test suites are CUnit programs. Without CUnit the library still
# builds, and `make check` says what to install.
AC_DEFUN([FSDP_CHECK_CUNIT], [
    PKG_CHECK_MODULES([CUNIT], [cunit >= 2.1], [fsdp_have_cunit=yes], [
        fsdp_save_LIBS="$LIBS"
        AC_CHECK_HEADER([CUnit/Basic.h],
            [AC_CHECK_LIB([cunit], [CU_initialize_registry],
                [fsdp_have_cunit=yes; CUNIT_LIBS="-lcunit"], [fsdp_have_cunit=no])],
            [fsdp_have_cunit=no])
        LIBS="$fsdp_save_LIBS"
    ])
    AS_IF([test "x$fsdp_have_cunit" != xyes],
          [AC_MSG_WARN([CUnit not found: make check needs libcunit1-dev (./bootstrap installs it)])])
    AM_CONDITIONAL([HAVE_CUNIT], [test "x$fsdp_have_cunit" = xyes])
])
