"""Every default a user can see, stated once: the library's parameters and the CLI's flags read them here.

A leaf module (no mlx, no other mlxinfer import), so the CLI can read it without loading a framework.
"""

BATCH_SIZE = 32  # seeds decoded together in one forward pass (sample, sweep)
ANSWERS_BATCH_SIZE = 64  # paths expanded together in one forward pass (answers; docs/performance.md says why)
MAX_TOKENS_GENERATE = 256  # new tokens for generate / stream_generate
MAX_TOKENS_SAMPLE = 5  # tokens per completion in seeded experiments: the lesson's five
MAX_SEEDS = 100_000  # a list of seeds is built before the first draw: bound it
MAX_SWEEP_DRAWS = 1_000_000  # a sweep's prompts x settings x seeds, each a pending draw listed before the first
MAX_GRID_CELLS = 10_000  # settings a sweep crosses: each is resolved, kept in the results file's header, summarised
SEED_LIMIT = 2**63  # seeds are whole numbers in [0, SEED_LIMIT)
FRESH_SEEDS = 2**32  # a seed drawn for the user is below this: short to type back, exact as a JavaScript number
MAX_STOPS, MAX_STOP_CHARS = 16, 256  # stop strings a request may give, and the longest (text is held back by it)
TOPK_TEMPERATURES = (0.5, 1.0, 1.5)  # the lesson's three temperatures
ANSWER_GROUP = "first-word"  # which completions count as one answer (engine/grouping.py says why)
EXACT_MIN_MASS = 0.99  # answers: walk until this much of every setting's probability is resolved
EXACT_MAX_NODES = 10_000  # answers: paths expanded at most (each holds its last token's keys and values)
QUALITY_WINDOW = 512  # tokens per independent window when measuring what quantization costs
SHARD_SIZE = "5GiB"  # largest safetensors file a written checkpoint holds (mlx-lm's MAX_FILE_SIZE_GB)
BENCH_PROMPT_TOKENS = (32, 128, 512)
PREFILL_CHUNK = 2048  # prompt tokens one prefill pass takes (mlx-lm's prefill_step_size)
PREFILL_CHUNK_CPU = 512  # the native kernels' paths (their bits do not depend on it): Ctrl-C is heard between chunks
TEMPLATE_SECONDS = 2.0  # CPU seconds a chat template may render for; past them it is refused (a loop without end)
MAX_MESSAGES = 10_000  # chat messages in one prompt
SERVE_HOST, SERVE_PORT = "127.0.0.1", 8080  # mlxinfer serve binds loopback unless told otherwise
SERVE_MAX_ROWS = 32  # rows (seeds) the server decodes together at most
SERVE_MAX_QUEUE = 64  # requests waiting at most; past it: 429 with Retry-After
SERVE_MAX_BODY_BYTES = 1_000_000  # the largest request body; past it: 413
SERVE_PROMPT_CACHE_BYTES = 256 * 2**20  # prefilled prompts the server keeps for requests that repeat them
SERVE_STALLED_S = 30.0  # a streaming client that takes none of its stream this long gives its rows up
