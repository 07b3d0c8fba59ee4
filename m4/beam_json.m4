# BEAM_JSON
# ---------
# json-c for the safetensors reader/writer of the `beammoe` tool
# (`audit --input`, `run --output`): the header of a safetensors file is JSON,
# and it is parsed with a maintained library, never by hand. Optional: without
# json-c the tool still builds and those two options say how to get it.
# --without-json-c turns the check off.
# Sets and substitutes JSON_C_CFLAGS and JSON_C_LIBS, defines HAVE_JSON_C,
# and the Automake conditional BEAM_WITH_JSON_C.
AC_DEFUN([BEAM_JSON], [
  AC_REQUIRE([PKG_PROG_PKG_CONFIG])
  AC_ARG_WITH([json-c],
    [AS_HELP_STRING([--without-json-c],
      [build the beammoe tool without safetensors input/output (default: use json-c when found)])],
    [], [with_json_c=check])
  beam_json_c=no
  AS_IF([test "x$with_json_c" != "xno"], [
    PKG_CHECK_MODULES([JSON_C], [json-c],
      [beam_json_c=yes
       AC_DEFINE([HAVE_JSON_C], [1],
         [Define to 1 when json-c is available (safetensors in the beammoe tool).])],
      [AS_IF([test "x$with_json_c" = "xyes"],
         [AC_MSG_ERROR([--with-json-c given but json-c was not found (Debian: libjson-c-dev)])],
         [AC_MSG_WARN([json-c not found: `beammoe audit --input` and `run --output` (safetensors) are disabled (Debian: libjson-c-dev)])])])
  ])
  AC_SUBST([JSON_C_CFLAGS])
  AC_SUBST([JSON_C_LIBS])
  AM_CONDITIONAL([BEAM_WITH_JSON_C], [test "x$beam_json_c" = "xyes"])
])
