# BEAM_EXACT_FP
# -------------
# The exact numerics (every FP32 operation its own IEEE operation rounded to
# nearest-even: no contraction into FMA, no fast math, no flush to zero, no
# excess precision) as configure checks, for GCC and clang alike:
#
# 1. A user's CFLAGS, CPPFLAGS and LDFLAGS come after ours on the command
#    line, so the flags that would change the arithmetic are refused by
#    name (LDFLAGS too: -ffast-math at link time links crtfastmath.o, which
#    turns on flush-to-zero for the whole process).
# 2. BEAM_CFLAGS gets -ffp-contract=off (an error when the compiler has no
#    such flag) and -fno-fast-math. GCC contracts by default in its GNU
#    modes (and -std=c99 alone turns that off), clang by default for every
#    target (-ffp-contract=on, also what -ffp-model=precise sets), and
#    aarch64 has FMA in every core: the flag is what keeps them apart.
# 3. Two probes with the flags the CPU library is compiled with catch what
#    no list foresees: the preprocessor must see no fast-math macro and
#    FLT_EVAL_METHOD 0 (no x87 excess precision), and a*b+c, t=a*b; t+c
#    and a loop of them must compile to no fused multiply-add instruction
#    (on x86-64 probed with -mfma, so that FMA is there to be used).
#
# Call after BEAM_CFLAGS and BEAM_CPU_CFLAGS are set; appends to BEAM_CFLAGS.
AC_DEFUN([BEAM_EXACT_FP], [
  AC_REQUIRE([AC_PROG_CC])
  AC_REQUIRE([AC_CANONICAL_HOST])
  AC_MSG_CHECKING([for flags that would change the arithmetic])
  beam_fp_bad=
  for beam_f in $CFLAGS $CPPFLAGS $LDFLAGS; do
    AS_CASE([$beam_f],
      [-ffast-math|-Ofast|-ffp-contract=fast*|-ffp-contract=on|-funsafe-math-optimizations|dnl
-ffinite-math-only|-fassociative-math|-freciprocal-math|-fno-signed-zeros|dnl
-fno-honor-nans|-fno-honor-infinities|-fapprox-func|-ffp-model=fast|-ffp-model=precise|dnl
-ffp-model=aggressive|-fdenormal-fp-math=preserve-sign*|-fdenormal-fp-math=positive-zero*|dnl
-mdaz-ftz|-mfpmath=387|-mfpmath=387,*|-mfpmath=both|-mrecip|-mrecip=*|-mlow-precision-*|dnl
-mfused-madd],
      [beam_fp_bad="$beam_fp_bad $beam_f"])
  done
  AS_IF([test -n "$beam_fp_bad"], [
    AC_MSG_RESULT([$beam_fp_bad])
    AC_MSG_ERROR([these flags in CFLAGS, CPPFLAGS or LDFLAGS would break beammoe's exact numerics:$beam_fp_bad
(refused for every compiler: -ffast-math, -Ofast, -ffp-contract=fast/on, -funsafe-math-optimizations,
-ffinite-math-only, -fassociative-math, -freciprocal-math, -fno-signed-zeros, -fno-honor-nans/infinities,
-fapprox-func, -ffp-model=fast/precise/aggressive (precise turns clang's FMA contraction back on),
-fdenormal-fp-math=preserve-sign/positive-zero, -mdaz-ftz, -mfpmath=387/both, -mrecip, -mlow-precision-*)])])
  AC_MSG_RESULT([none])

  # (after the names: with -ffp-model=fast clang refuses -ffp-contract=off)
  BEAM_CHECK_CFLAG([-ffp-contract=off], [BEAM_CFLAGS])
  AS_CASE([$BEAM_CFLAGS], [*-ffp-contract=off*], [],
    [AC_MSG_ERROR([$CC cannot turn off FMA contraction (-ffp-contract=off); the exact numerics need it])])
  BEAM_CHECK_CFLAG([-fno-fast-math], [BEAM_CFLAGS])

  beam_save_CFLAGS=$CFLAGS
  CFLAGS="$BEAM_CFLAGS $BEAM_CPU_CFLAGS $CFLAGS"
  AC_CACHE_CHECK([whether $CC keeps IEEE semantics with these flags], [beam_cv_fp_macros], [
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <float.h>
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__) || \
    defined(__ASSOCIATIVE_MATH__) || defined(__RECIPROCAL_MATH__) || defined(__NO_SIGNED_ZEROS__)
#error fast math
#endif
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error float expressions are not evaluated in float
#endif]], [])],
      [beam_cv_fp_macros=yes], [beam_cv_fp_macros=no])])
  AS_IF([test "x$beam_cv_fp_macros" != xyes],
    [AC_MSG_ERROR([$CC with "$CFLAGS" has fast math on or evaluates float in a wider type (FLT_EVAL_METHOD != 0, x87): beammoe's exact numerics need IEEE binary32 operations])])

  # a target with FMA for the contraction probe (x86-64 has it only with -mfma)
  beam_fma_flag=
  AS_CASE([$host_cpu], [x86_64|i?86], [BEAM_CHECK_CFLAG([-mfma], [beam_fma_flag])])
  AC_CACHE_CHECK([whether $CC contracts a*b+c into a fused multiply-add], [beam_cv_fp_contract], [
    beam_cv_fp_contract=unknown
    AC_LANG_CONFTEST([AC_LANG_SOURCE([[
float beam_probe_expr(float a, float b, float c) { return a * b + c; }
float beam_probe_stmt(float a, float b, float c) { float t = a * b; return t + c; }
void beam_probe_loop(float *y, const float *a, const float *b, float w, int n)
{
    int i;
    for (i = 0; i < n; i++) *(y + i) = *(y + i) + w * *(a + i) + *(a + i) * *(b + i);
}]])])
    AS_IF([AC_RUN_LOG([$CC $CFLAGS $beam_fma_flag -S -o conftest.s conftest.$ac_ext])], [
      AS_IF([grep -Ei '^@<:@@<:@:space:@:>@@:>@+(v?fn?m(add|sub)|fml@<:@as@:>@|x@<:@sv@:>@n?m(add|sub))' conftest.s >&AS_MESSAGE_LOG_FD 2>&1],
        [beam_cv_fp_contract=yes], [beam_cv_fp_contract=no])])
    rm -f conftest.s])
  CFLAGS=$beam_save_CFLAGS
  AS_IF([test "x$beam_cv_fp_contract" = xyes],
    [AC_MSG_ERROR([$CC with "$BEAM_CFLAGS $BEAM_CPU_CFLAGS $CFLAGS" contracts a*b+c into a fused multiply-add: beammoe's exact numerics forbid it (config.log has the instructions found)])])
  AS_IF([test "x$beam_cv_fp_contract" = xunknown],
    [AC_MSG_WARN([could not compile the contraction probe to assembly with $CC: FMA contraction not checked])])
])
