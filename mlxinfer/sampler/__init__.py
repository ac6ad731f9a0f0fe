"""The sampler: the code after the model that turns one row of scores into one token.

The lesson's chain, each stage a small pure function over MLX arrays:

    scores -> adjustments (apply_logit_bias, apply_penalties, apply_mask)
           -> apply_temperature (divide by T) -> softmax / log_softmax
           -> cut the tail (apply_top_k, apply_top_p, apply_min_p) and rescale to 1
           -> draw one token                      temperature 0: argmax instead

The stages are in stages.py, the draw in drawing.py, and a row's whole draw through a generation
(its key chain, penalty history, processors; a batch of rows at once) in row.py. The settings
(``SamplerSettings``) live in settings.py, without mlx; the tables that show what the chain does
(the next-token table, ``explain``) in engine/tables.py.

Two orders of the last steps (``SamplerSettings.order``):

* ``"temperature-first"`` (default) is the order the lesson describes: divide by the temperature
  first, then cut the tail of the tempered probabilities (as transformers and vLLM do).
* ``"mlx-lm"`` reproduces ``mlx_lm.sample_utils.make_sampler``: it cuts the tail of the
  *untempered* log-probabilities (top-p, then min-p, then top-k) and applies the
  temperature only in the draw, ``mx.random.categorical(logprobs * (1 / T))``.

Top-k keeps the same tokens in either order; top-p and min-p do not. With no cut the two
orders are the same computation, and the draw is token-for-token identical to mlx-lm's
under the same ``mx.random.seed``. A draw with an explicit ``key`` equals the global stream's:
after ``mx.random.seed(s)`` the global stream is the key chain ``state = mx.random.key(s)``,
then per draw ``state, sub = mx.random.split(state)``; each row of a batch carries its own
chain (row.py), so a seed draws the same tokens whatever shares its batch.
"""

from . import drawing as _drawing, row as _row, stages as _stages
from .drawing import *  # noqa: F403 - each module lists its public names in __all__
from .row import *  # noqa: F403
from .stages import *  # noqa: F403

__all__ = [*_stages.__all__, *_drawing.__all__, *_row.__all__]
