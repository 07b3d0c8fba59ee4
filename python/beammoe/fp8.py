"""The former name of quant.py (FP8, NVFP4, MXFP8), kept: the same objects."""
from .quant import (FP8Quant, MXFP8Quant, NVFP4Quant, NVFP4_SCALE_LIMIT, QUANTS,  # noqa: F401
                    beam_moe_finalize_gather_norm_residual_norm_fp8, beam_moe_finalize_gather_norm_residual_norm_q,
                    beam_moe_finalize_norm_residual_norm_fp8, beam_moe_finalize_norm_residual_norm_q,
                    beam_norm_residual_norm_fp8, beam_norm_residual_norm_q, empty_outputs)
