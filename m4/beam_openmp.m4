# BEAM_OPENMP
# -----------
# OpenMP for the CPU backend: AC_OPENMP finds the flag (--disable-openmp turns
# it off); then check that a parallel loop really compiles and links with it.
# Sets and substitutes OPENMP_CFLAGS; without OpenMP the backend runs on one
# thread and gives the same bits.
AC_DEFUN([BEAM_OPENMP], [
  AC_REQUIRE([AC_PROG_CC])
  AC_OPENMP
  AS_IF([test "x$enable_openmp" != "xno" && test "x$ac_cv_prog_c_openmp" != "xunsupported"], [
    beam_save_CFLAGS=$CFLAGS
    CFLAGS="$CFLAGS $OPENMP_CFLAGS"
    AC_MSG_CHECKING([whether an OpenMP parallel loop links])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <omp.h>]],
        [[int i, s = 0;
          #pragma omp parallel for reduction(+:s)
          for (i = 0; i < 10; i++) s += i;
          return s == 45 && omp_get_max_threads() > 0 ? 0 : 1;]])],
      [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no]); OPENMP_CFLAGS=])
    CFLAGS=$beam_save_CFLAGS
  ], [OPENMP_CFLAGS=])
  AC_SUBST([OPENMP_CFLAGS])
])
