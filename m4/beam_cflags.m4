# BEAM_CHECK_CFLAG(FLAG, VARIABLE)
# --------------------------------
# Append FLAG to VARIABLE when the C compiler accepts it with -Werror.
AC_DEFUN([BEAM_CHECK_CFLAG], [
  AS_VAR_PUSHDEF([beam_cv], [beam_cv_cflag_$1])
  AC_CACHE_CHECK([whether $CC accepts $1], [beam_cv], [
    beam_save_CFLAGS=$CFLAGS
    CFLAGS="$CFLAGS -Werror $1"
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])], [AS_VAR_SET([beam_cv], [yes])], [AS_VAR_SET([beam_cv], [no])])
    CFLAGS=$beam_save_CFLAGS])
  AS_VAR_IF([beam_cv], [yes], [$2="$$2 $1"])
  AS_VAR_POPDEF([beam_cv])
])
