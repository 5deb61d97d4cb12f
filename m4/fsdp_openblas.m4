# FSDP_CHECK_OPENBLAS: bench_gemm's optional baseline. When OpenBLAS is found (pkg-config's
# openblas, as Debian's libopenblas-dev installs it), bench_gemm times cblas_sgemm on one thread
# next to the sim's GEMM; libfsdp itself never uses or links it. --without-openblas skips it.
AC_DEFUN([FSDP_CHECK_OPENBLAS], [
    AC_ARG_WITH([openblas],
        [AS_HELP_STRING([--without-openblas], [no OpenBLAS baseline in bench_gemm])],
        [], [with_openblas=check])
    fsdp_have_openblas=no
    AS_IF([test "x$with_openblas" != xno], [
        PKG_CHECK_MODULES([OPENBLAS], [openblas], [
            fsdp_save_CPPFLAGS="$CPPFLAGS"
            fsdp_save_LIBS="$LIBS"
            CPPFLAGS="$CPPFLAGS $OPENBLAS_CFLAGS"
            LIBS="$OPENBLAS_LIBS $LIBS"
            AC_CHECK_HEADER([cblas.h],
                [AC_CHECK_FUNC([openblas_set_num_threads], [fsdp_have_openblas=yes])])
            CPPFLAGS="$fsdp_save_CPPFLAGS"
            LIBS="$fsdp_save_LIBS"
        ], [:])
    ])
    AS_IF([test "x$with_openblas" = xyes && test "x$fsdp_have_openblas" != xyes],
          [AC_MSG_ERROR([--with-openblas: OpenBLAS not found (install libopenblas-dev)])])
    AM_CONDITIONAL([HAVE_OPENBLAS], [test "x$fsdp_have_openblas" = xyes])
])
