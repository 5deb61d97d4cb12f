# FSDP_CHECK_NCCL: --with-nccl[=DIR] (default: guess). Probed only when CUDA was found.
# Exports NCCL_CPPFLAGS, NCCL_LDFLAGS, NCCL_LIBS and sets fsdp_have_nccl=yes|no.
AC_DEFUN([FSDP_CHECK_NCCL], [
    AC_REQUIRE([FSDP_CHECK_CUDA])
    AC_ARG_WITH([nccl],
        [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@],
                        [NCCL for the gpu backend (default: guess, inside the CUDA toolkit)])],
        [], [with_nccl=guess])
    fsdp_have_nccl=no
    NCCL_CPPFLAGS=""
    NCCL_LDFLAGS=""
    NCCL_LIBS=""
    AS_IF([test "x$with_nccl" != xno && test "x$fsdp_have_cuda" = xyes], [
        AS_CASE([$with_nccl],
            [guess|yes], [fsdp_nccl_home="$CUDA_HOME"],
            [fsdp_nccl_home="$with_nccl"])
        fsdp_nccl_libdir="$fsdp_nccl_home/lib64"
        AS_IF([test ! -d "$fsdp_nccl_libdir"], [fsdp_nccl_libdir="$fsdp_nccl_home/lib"])
        fsdp_save_CPPFLAGS="$CPPFLAGS"
        fsdp_save_LDFLAGS="$LDFLAGS"
        fsdp_save_LIBS="$LIBS"
        CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS -I$fsdp_nccl_home/include"
        LDFLAGS="$LDFLAGS $CUDA_LDFLAGS -L$fsdp_nccl_libdir"
        fsdp_have_nccl=yes
        AC_CHECK_HEADER([nccl.h], [], [fsdp_have_nccl=no])
        AS_IF([test $fsdp_have_nccl = yes],
              [AC_CHECK_LIB([nccl], [ncclCommInitRank], [], [fsdp_have_nccl=no], [-lcudart])])
        CPPFLAGS="$fsdp_save_CPPFLAGS"
        LDFLAGS="$fsdp_save_LDFLAGS"
        LIBS="$fsdp_save_LIBS"
        AS_IF([test $fsdp_have_nccl = yes], [
            NCCL_CPPFLAGS="-I$fsdp_nccl_home/include"
            NCCL_LDFLAGS="-L$fsdp_nccl_libdir -Wl,-rpath,$fsdp_nccl_libdir"
            NCCL_LIBS="-lnccl"
        ], [
            AS_IF([test "x$with_nccl" != xguess],
                  [AC_MSG_ERROR([NCCL requested (--with-nccl=$with_nccl) but not found under $fsdp_nccl_home])],
                  [AC_MSG_WARN([NCCL not found: the gpu backend is off])])
        ])
    ], [
        AS_IF([test "x$with_nccl" != xno && test "x$with_nccl" != xguess],
              [AC_MSG_ERROR([--with-nccl needs CUDA, which was not found])])
    ])
    AC_SUBST([NCCL_CPPFLAGS])
    AC_SUBST([NCCL_LDFLAGS])
    AC_SUBST([NCCL_LIBS])
])
