# FSDP_CHECK_DL: libfsdp loads the gpu backend module with dlopen (in libc since glibc 2.34,
# in libdl before). Exports DL_LIBS.
AC_DEFUN([FSDP_CHECK_DL], [
    fsdp_save_LIBS="$LIBS"
    LIBS=""
    AC_SEARCH_LIBS([dlopen], [dl], [],
                   [AC_MSG_ERROR([dlopen is required (to load the gpu backend module)])])
    AC_CHECK_HEADERS([dlfcn.h], [], [AC_MSG_ERROR([dlfcn.h is required])])
    DL_LIBS="$LIBS"
    LIBS="$fsdp_save_LIBS"
    AC_SUBST([DL_LIBS])
])
