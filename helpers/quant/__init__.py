"""Quantization: number formats in torch, llm-compressor recipes, and checkpoints cached by content.

::

    from helpers import quant
    quant.grid("fp8_e4m3")                                  # every value E4M3 holds (lab 12)
    quant.fake_quantize(w, "nvfp4")                         # w rounded through NVFP4 and back (lab 13)
    ckpt = quant.build("default", quant.W4A16_GPTQ)         # a compressed-tensors checkpoint, cached (lab 14)
    quant.check_servable(quant.FP8_DYNAMIC)                 # refused on CPU, naming what to serve instead
    quant.fake_quantized_checkpoint("default", "fp8_e4m3")  # FP8's accuracy, served as bf16 on any machine

- :mod:`~helpers.quant.formats`: grids, fake quantization, error statistics (torch only);
- :mod:`~helpers.quant.recipes`: typed recipes, the group-size and device checks;
- :mod:`~helpers.quant.env`: where the llm-compressor environment is (``.venv-quant``, ``LABS_QUANT_PYTHON``);
- :mod:`~helpers.quant.cache`: content-hashed, atomically built, locked checkpoint folders;
- :mod:`~helpers.quant.build`: llm-compressor run as a subprocess (``_worker.py``) in that environment;
- :mod:`~helpers.quant.fake`: bf16 checkpoints with fake-quantized Linear weights;
- :mod:`~helpers.quant.dequant`: a compressed checkpoint's codes x scales as plain weights, served where its format
  cannot be (:func:`servable`);
- :mod:`~helpers.quant.serving`: one configuration of a lab's plan, served (a fake-quantized copy swapped into a
  running server in place).
"""

from .build import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, QuantBuildError, build, default_calibration, model_dir
from .cache import Checkpoint, discard
from .env import QuantEnvMissing, llmcompressor_version, quant_python, quant_torch_version
from .dequant import dequantize_module, dequantized_checkpoint, servable
from .fake import FAKE_DEFAULTS, fake_quantized_checkpoint
from .serving import serve, serving_profile
from .formats import (FORMATS, ErrorStats, FloatSpec, Quantized, error_stats, fake_quantize, float_spec, grid,
                      nvfp4_global_scale, quantize, round_to_grid)
from .recipes import (FP8_DYNAMIC, MXFP4, MXFP4A16, NVFP4, NVFP4A16, RECIPES, W4A16_AWQ, W4A16_GPTQ,
                      W4A16_GPTQ_NO_ACTORDER, W4A16_RTN, W8A8_RTN, W8A8_SQ_GPTQ, Recipe, UnservableError,
                      check_group_size, check_kv_cache_dtype, check_servable, checkpoint_format, first_layers, has_kernel,
                      linear_shapes, recipe)

__all__ = [
    "FORMATS", "FloatSpec", "Quantized", "ErrorStats", "grid", "float_spec", "round_to_grid", "quantize",
    "fake_quantize", "nvfp4_global_scale", "error_stats",
    "Recipe", "RECIPES", "recipe", "first_layers", "FP8_DYNAMIC", "W8A8_RTN", "W8A8_SQ_GPTQ", "W4A16_RTN", "W4A16_GPTQ",
    "W4A16_GPTQ_NO_ACTORDER", "W4A16_AWQ", "NVFP4", "NVFP4A16", "MXFP4", "MXFP4A16",
    "UnservableError", "check_group_size", "check_kv_cache_dtype", "check_servable", "has_kernel", "checkpoint_format",
    "linear_shapes",
    "quant_python", "llmcompressor_version", "quant_torch_version", "QuantEnvMissing",
    "Checkpoint", "discard", "build", "QuantBuildError", "default_calibration", "model_dir", "DEFAULT_SAMPLES",
    "DEFAULT_SEQ_LEN", "fake_quantized_checkpoint", "FAKE_DEFAULTS", "dequantize_module", "dequantized_checkpoint",
    "servable", "serve", "serving_profile",
]
