# BEAM_CUDA
# ---------
# --with-cuda[=DIR]: build libbeammoe_cuda. Default: detect (DIR from
# $CUDA_HOME, else /usr/local/cuda); --without-cuda builds the CPU backend
# only; --with-cuda that finds no toolkit is an error.
# Needs nvcc, cuda_runtime.h, libcudart, nccl.h and libnccl (NCCL may also be
# installed system-wide, e.g. Debian's libnccl-dev).
# Sets: BEAM_WITH_CUDA (Automake conditional), NVCC, NVCC_FLAGS,
# CUDA_CPPFLAGS, CUDA_LDFLAGS, CUDA_LIBS, NCCL_LIBS; defines in config.h
# BEAM_CUDART_SONAME and BEAM_CUDART_DIR (the runtime devmem.c loads).
AC_DEFUN([BEAM_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA backend (default: if found; DIR: toolkit root)])],
    [], [with_cuda=check])
  AC_ARG_VAR([NVCC], [CUDA compiler])
  AC_ARG_VAR([NVCC_FLAGS], [flags for nvcc (default: -O3, sm_90 code plus compute_90 PTX, --fmad=false)])
  beam_cuda=no
  AS_CASE([$with_cuda],
    [no], [],
    [yes|check], [beam_cuda_dir=${CUDA_HOME:-/usr/local/cuda}],
    [beam_cuda_dir=$with_cuda])
  AS_IF([test "x$with_cuda" != "xno"], [
    AS_IF([test -z "$NVCC"], [AC_PATH_PROG([NVCC], [nvcc], [], [$beam_cuda_dir/bin$PATH_SEPARATOR$PATH])])
    CUDA_CPPFLAGS="-I$beam_cuda_dir/include"
    beam_cuda_libdir=$beam_cuda_dir/lib64
    AS_IF([test ! -d "$beam_cuda_libdir"], [beam_cuda_libdir=$beam_cuda_dir/lib])
    CUDA_LDFLAGS="-L$beam_cuda_libdir -Wl,-rpath,$beam_cuda_libdir"
    beam_save_CPPFLAGS=$CPPFLAGS
    beam_save_LDFLAGS=$LDFLAGS
    beam_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
    LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
    beam_cuda=yes
    AS_IF([test -z "$NVCC"], [beam_cuda=no])
    AS_IF([test $beam_cuda = yes], [AC_CHECK_HEADER([cuda_runtime.h], [], [beam_cuda=no])])
    AS_IF([test $beam_cuda = yes], [AC_CHECK_LIB([cudart], [cudaGetDeviceCount], [CUDA_LIBS=-lcudart], [beam_cuda=no])])
    beam_have_cudart=$beam_cuda
    AS_IF([test $beam_cuda = yes], [AC_CHECK_HEADER([nccl.h], [], [beam_cuda=no])])
    AS_IF([test $beam_cuda = yes], [AC_CHECK_LIB([nccl], [ncclGetVersion], [NCCL_LIBS=-lnccl], [beam_cuda=no])])
    # The runtime's soname as the CUDA backend links it (a program linked
    # with the same flags names it in NEEDED): harness/devmem.c dlopens that
    # one, the copy the backend loaded or from where the backend finds it,
    # instead of guessing a list of versions.
    AS_IF([test $beam_cuda = yes], [
      AC_MSG_CHECKING([for the soname of the CUDA runtime that the backend links])
      LIBS="$CUDA_LIBS $beam_save_LIBS"
      beam_cudart_soname=
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>]],
                                      [[int n = 0; return (int)cudaGetDeviceCount(&n);]])],
        [beam_cudart_soname=`$OBJDUMP -p conftest$EXEEXT 2>/dev/null |
           $SED -n 's/^ *NEEDED *\(libcudart@<:@^ @:>@*\) *$/\1/p' | $SED q`])
      AS_IF([test -n "$beam_cudart_soname"], [
        AC_MSG_RESULT([$beam_cudart_soname])
        AC_DEFINE_UNQUOTED([BEAM_CUDART_SONAME], ["$beam_cudart_soname"],
          [the soname of the CUDA runtime that libbeammoe_cuda links (harness/devmem.c)])
        AC_DEFINE_UNQUOTED([BEAM_CUDART_DIR], ["$beam_cuda_libdir"],
          [the folder where configure found that runtime (harness/devmem.c)])
      ], [
        AC_MSG_RESULT([unknown])
        AC_MSG_WARN([no soname of libcudart found (objdump missing, or a static runtime): the beammoe tool and the tests will not reach device memory])])
    ])
    AS_IF([test $beam_have_cudart = yes && test $beam_cuda = no],
      [AC_MSG_WARN([the CUDA toolkit is there but NCCL is not (nccl.h, libnccl): the CUDA backend needs NCCL (Debian/Ubuntu: libnccl-dev), so it is not built])])
    CPPFLAGS=$beam_save_CPPFLAGS
    LDFLAGS=$beam_save_LDFLAGS
    LIBS=$beam_save_LIBS
    AS_IF([test $beam_cuda = no && test "x$with_cuda" != "xcheck"],
      [AC_MSG_ERROR([--with-cuda: no usable CUDA toolkit with NCCL under $beam_cuda_dir (nvcc, cuda_runtime.h, libcudart, nccl.h, libnccl)])])
  ])
  # -Xfatbin -compress-all: every object's device code compressed, not
  # by fatbinary's own rule, which left some uncompressed (the library's
  # size: docs/log/2026-12-04-shapes.md, library)
  AS_IF([test -z "$NVCC_FLAGS"],
    [NVCC_FLAGS="-O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 --fmad=false --prec-div=true --prec-sqrt=true --ftz=false -Xfatbin -compress-all -Xcompiler -fvisibility=hidden"])
  # The exact numerics (docs/numerics.md) hold only without fast math: a
  # user's NVCC_FLAGS may tune code generation, never the arithmetic.
  AS_CASE([" $NVCC_FLAGS "],
    [*use_fast_math*|*fmad=true*|*ftz=true*|*prec-div=false*|*prec-sqrt=false*],
    [AC_MSG_ERROR([NVCC_FLAGS="$NVCC_FLAGS" would break beammoe's exact numerics: drop --use_fast_math, --fmad=true, --ftz=true, --prec-div=false, --prec-sqrt=false])])
  for beam_f in --fmad=false --ftz=false --prec-div=true --prec-sqrt=true; do
    AS_CASE([" $NVCC_FLAGS "], [*" $beam_f "*], [], [NVCC_FLAGS="$NVCC_FLAGS $beam_f"])
  done
  AC_MSG_CHECKING([whether to build the CUDA backend])
  AC_MSG_RESULT([$beam_cuda])
  AM_CONDITIONAL([BEAM_WITH_CUDA], [test $beam_cuda = yes])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LDFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([NCCL_LIBS])
])
