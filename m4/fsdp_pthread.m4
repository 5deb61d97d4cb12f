# FSDP_CHECK_PTHREAD: the sim backend runs one thread per rank.
AC_DEFUN([FSDP_CHECK_PTHREAD], [
    fsdp_save_LIBS="$LIBS"
    AC_SEARCH_LIBS([pthread_create], [pthread], [],
                   [AC_MSG_ERROR([pthreads are required (pthread_create not found)])])
    AC_CHECK_HEADERS([pthread.h], [], [AC_MSG_ERROR([pthread.h is required])])
    PTHREAD_LIBS="$LIBS"
    LIBS="$fsdp_save_LIBS"
    AS_CASE([$PTHREAD_LIBS], [*-lpthread*], [PTHREAD_LIBS="-lpthread"], [PTHREAD_LIBS=""])
    AC_SUBST([PTHREAD_LIBS])
])
