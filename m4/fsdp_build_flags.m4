# FSDP_CHECK_BUILD_FLAGS: warnings, --enable-debug and the sanitizers.
#
# FSDP_CFLAGS carries warnings for the project's own code (-Werror with --enable-werror, which
# CI uses). Each sanitizer is link-tested before it is accepted.

# FSDP_ARG_ENABLE_SANITIZER(name, flags)
AC_DEFUN([FSDP_ARG_ENABLE_SANITIZER], [
    AC_ARG_ENABLE([$1],
        [AS_HELP_STRING([--enable-$1], [build with $2])],
        [], [enable_$1=no])
    AS_IF([test "x$enable_$1" = xyes], [
        fsdp_save_CFLAGS="$CFLAGS"
        fsdp_save_LDFLAGS="$LDFLAGS"
        CFLAGS="$CFLAGS $2"
        LDFLAGS="$LDFLAGS $2"
        AC_MSG_CHECKING([whether $CC links with $2])
        AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])],
            [AC_MSG_RESULT([yes])
             fsdp_sanitizers="$fsdp_sanitizers $1"],
            [AC_MSG_RESULT([no])
             AC_MSG_ERROR([--enable-$1: $CC cannot build with $2])])
    ])
])

AC_DEFUN([FSDP_CHECK_BUILD_FLAGS], [
    fsdp_sanitizers=""
    AC_ARG_ENABLE([debug],
        [AS_HELP_STRING([--enable-debug], [no optimization, debug info, internal assertions])],
        [], [enable_debug=no])
    fsdp_debug=0
    AS_IF([test "x$enable_debug" = xyes], [CFLAGS="$CFLAGS -O0 -g3"; fsdp_debug=1])
    AC_DEFINE_UNQUOTED([FSDP_ENABLE_DEBUG], [$fsdp_debug], [Define to 1 for internal assertions])
    AC_ARG_ENABLE([werror],
        [AS_HELP_STRING([--enable-werror], [treat warnings as errors])],
        [], [enable_werror=no])

    FSDP_ARG_ENABLE_SANITIZER([asan], [-fsanitize=address -fno-omit-frame-pointer])
    FSDP_ARG_ENABLE_SANITIZER([ubsan], [-fsanitize=undefined -fno-sanitize-recover=all])
    FSDP_ARG_ENABLE_SANITIZER([tsan], [-fsanitize=thread])
    AS_IF([test "x$enable_tsan" = xyes && test "x$enable_asan" = xyes],
          [AC_MSG_ERROR([--enable-tsan and --enable-asan cannot be combined])])
    AM_CONDITIONAL([FSDP_TSAN], [test "x$enable_tsan" = xyes])

    # -Wformat-truncation is a heuristic whose verdicts change with the optimization level
    # (-O0 sanitizer builds warn where -O2 does not); messages are truncated by design. Turned off
    # where the compiler has it (clang has not, and refuses the unknown option under -Werror).
    FSDP_CFLAGS="-Wall -Wextra -Wundef -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter"
    fsdp_save_cflags=$CFLAGS
    CFLAGS="$CFLAGS -Werror -Wformat-truncation"
    AC_MSG_CHECKING([whether $CC has -Wformat-truncation])
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])],
        [AC_MSG_RESULT([yes]); FSDP_CFLAGS="$FSDP_CFLAGS -Wno-format-truncation"],
        [AC_MSG_RESULT([no])])
    CFLAGS=$fsdp_save_cflags
    AS_IF([test "x$enable_werror" = xyes], [FSDP_CFLAGS="$FSDP_CFLAGS -Werror"])
    # The host C code rounds every operation as written: the kernel bodies it shares with the
    # CUDA code (compiled with --fmad=false) must give the GPU's bits, which a fused multiply-add
    # would change under -march=native or any FMA target (gnu11 lets gcc contract by default).
    # tests/test_build_flags.sh checks it is here.
    FSDP_CFLAGS="$FSDP_CFLAGS -ffp-contract=off"
    AC_SUBST([FSDP_CFLAGS])
])
