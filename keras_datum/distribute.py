"""Distribution strategy and mixed-precision defaults.

- `strategy="auto"`: `tf.distribute.MirroredStrategy` over all visible GPUs when
  there is more than one, else the default (no-op) strategy. A
  `tf.distribute.Strategy` instance is used as given. It is created on first
  use of `DatumDataset.strategy` or of a split, never at import.
- `mixed_precision="auto"`: `mixed_float16` when every visible GPU has CUDA
  compute capability 7.0 or more, `mixed_bfloat16` on TPU, and no change on
  CPU; on Keras's JAX backend, as JAX sees the devices once it has started
  them (it is never started here). It is
  applied when the `DatumDataset` is created, so that a model built afterwards
  (typically in `with ds.strategy.scope():`) picks it up. `"float32"` leaves
  the global Keras policy alone; `"mixed_float16"` and `"mixed_bfloat16"`
  set it.
- Under a mixed policy images leave the pipeline in the policy's compute dtype
  (float16 or bfloat16): half the bytes to copy to the device. Pixel values
  0..255 are exact in both; the only rounding is of resized (fractional)
  values, far below what a network notices. Augmentation still runs in
  float32, before the cast.
"""

import importlib.util
import re

import keras
import tensorflow as tf

from keras_datum import notices

MIXED_PRECISION_MODES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def check_strategy(strategy):
    if isinstance(strategy, tf.distribute.Strategy) and keras.backend.backend() != "tensorflow":
        raise ValueError(
            "A tf.distribute strategy distributes Keras's TensorFlow backend only, "
            f"and Keras runs on {keras.backend.backend()}. Leave `strategy` at 'auto' "
            "(the batches are then global ones) and distribute with keras.distribution "
            "(keras.distribution.DataParallel on JAX); see docs/distribution.md. "
            f"Received: strategy={strategy!r}"
        )
    if strategy == "auto" or isinstance(strategy, tf.distribute.Strategy):
        return strategy
    raise ValueError(
        "`strategy` must be 'auto' or a tf.distribute.Strategy instance. "
        f"Received: strategy={strategy!r}"
    )


def resolve_strategy(strategy):
    """`strategy`, or for `"auto"`: the strategy whose `scope()` is active,
    else MirroredStrategy over two or more GPUs, else the default one."""
    if strategy != "auto":
        return strategy
    if in_strategy_scope() or keras.backend.backend() != "tensorflow":
        # On JAX and PyTorch, keras.distribution distributes, not tf.distribute.
        return tf.distribute.get_strategy()
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    return tf.distribute.get_strategy()


def in_strategy_scope():
    """Whether a `strategy.scope()` is active (its strategy then serves "auto")."""
    return tf.distribute.has_strategy()


def cuda_capability(text):
    """A CUDA compute capability written `"major.minor"` as `(major, minor)`;
    `None` for anything else (JAX writes a ROCm GPU's as its gfx version)."""
    match = re.fullmatch(r"(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def accelerators():
    """`(platform, devices)` as the Keras backend sees them.

    `platform` is `"tpu"`, `"gpu"` or `"cpu"`, or `"unknown"` (see
    `_jax_accelerators`); `devices` holds each GPU's CUDA compute capability
    as `(major, minor)` (`None` when it has none, such as an AMD GPU). JAX and
    PyTorch are asked themselves when they are the backend: TensorFlow is kept
    off their GPUs (`keep_tensorflow_off_gpus`), and a JAX install usually has
    TensorFlow's CPU build, which sees no GPU at all. Physical devices only on
    TensorFlow: listing logical ones
    would start its runtime, after which users can no longer configure
    devices or threads.
    """
    if keras.backend.backend() == "jax":
        return _jax_accelerators()
    if keras.backend.backend() == "torch":
        return _torch_accelerators()
    if tf.config.list_physical_devices("TPU"):
        return "tpu", []
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu", []
    capabilities = []
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        capability = details.get("compute_capability")
        capabilities.append(tuple(capability) if capability else None)
    return "gpu", capabilities


def _jax_started():
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # Another JAX: assume not started.
        return False


def _jax_accelerator_installed():
    """Whether JAX has a GPU plugin (`jax_plugins`) or libtpu installed:
    found on disk, without importing or starting anything."""
    return any(
        importlib.util.find_spec(name) is not None for name in ("jax_plugins", "libtpu")
    )


def _jax_accelerators():
    """`accelerators()` on Keras's JAX backend.

    JAX's devices are asked only once JAX has started them (any JAX or Keras
    computation does): asking starts them, after which
    `keras.distribution.initialize()` and `jax.distributed.initialize()` no
    longer work, and creating a `DatumDataset` must not take that away. Before
    then, a JAX with no GPU plugin and no libtpu installed has only the CPU;
    with one, the platform is `"unknown"`.
    """
    if _jax_started():
        import jax

        return from_jax_devices(jax.devices())
    return ("unknown", []) if _jax_accelerator_installed() else ("cpu", [])


def _torch_accelerators():
    """`accelerators()` on Keras's PyTorch backend, as PyTorch sees CUDA."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", []
    count = torch.cuda.device_count()
    return "gpu", [tuple(torch.cuda.get_device_capability(i)) for i in range(count)]


def keep_tensorflow_off_gpus():
    """On Keras's JAX and PyTorch backends, TensorFlow runs tf.data only, on
    the CPU: the GPUs are hidden from it before it starts on them, so that it
    does not reserve GPU memory the backend needs (TensorFlow takes most of a
    GPU's memory when it starts on it). Warns when TensorFlow has already
    started on them.

    Returns:
        Whether the GPUs are hidden from TensorFlow (False on Keras's
        TensorFlow backend, which trains on them).
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return False
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:  # TensorFlow's runtime already started on the GPUs.
        notices.warn(
            f"TensorFlow had started on the GPUs before the DatumDataset was made, so "
            f"it may hold GPU memory that Keras's {backend} backend needs. Make the "
            "DatumDataset before any TensorFlow op runs, or call "
            "tf.config.set_visible_devices([], 'GPU') first.",
        )
        return False
    return True


def from_jax_devices(devices):
    """`accelerators()`' answer for JAX's `devices` (`jax.devices()`)."""
    platform = devices[0].platform if devices else "cpu"
    if platform != "gpu":
        return platform, []
    return "gpu", [cuda_capability(getattr(d, "compute_capability", "")) for d in devices]


def policy_for(platform, capabilities):
    """The policy `mixed_precision="auto"` picks for `accelerators()`' answer,
    or None: float16 needs the tensor cores of CUDA capability 7.0 (Volta)
    on every GPU; a GPU of unknown capability, or an unknown platform, keeps
    float32."""
    if platform == "tpu":
        return "mixed_bfloat16"
    if platform == "gpu" and capabilities and all(
        c is not None and c >= (7, 0) for c in capabilities
    ):
        return "mixed_float16"
    return None


def apply_mixed_precision(mode):
    """Sets the global Keras dtype policy for `mode`; returns the policy name in force."""
    policy = mode
    if mode == "auto":
        platform, capabilities = accelerators()
        policy = policy_for(platform, capabilities)
        if platform == "unknown":
            notices.warn(
                "mixed_precision='auto' left the Keras dtype policy as it was: Keras "
                "runs on JAX, which has a GPU or TPU plugin but has not started its "
                "devices yet, and starting them here would stop a later "
                "keras.distribution.initialize() from working. Pass "
                "mixed_precision='mixed_float16' (GPU) or 'mixed_bfloat16' (TPU), "
                "or create the DatumDataset once JAX has started (after any Keras "
                "computation, or jax.devices()).",
            )
    if policy not in (None, "float32"):
        keras.mixed_precision.set_global_policy(policy)
    return keras.mixed_precision.global_policy().name


def input_dtype():
    """The dtype images leave the pipeline in: the policy's compute dtype."""
    return keras.mixed_precision.global_policy().compute_dtype


def num_workers(strategy):
    """Worker machines (processes) in `strategy`'s cluster: 1 without a cluster.

    `MultiWorkerMirroredStrategy` knows its cluster from `TF_CONFIG` through
    its cluster resolver; other strategies have none.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("worker", [])) + len(spec.get("chief", [])))


def auto_shard_policy(strategy, num_files):
    """FILE sharding when every worker can get its own shard files, else DATA."""
    workers = num_workers(strategy)
    if num_files >= workers:
        return tf.data.experimental.AutoShardPolicy.FILE
    return tf.data.experimental.AutoShardPolicy.DATA


def check_data_service(data_service, strategy):
    """Refuses a malformed dispatcher address, and a data service under a
    multi-worker `strategy`."""
    if not isinstance(data_service, str) or not data_service:
        raise ValueError(
            "`data_service` must be a tf.data service dispatcher address "
            f"such as 'grpc://host:5050', or None. Received: data_service={data_service!r}"
        )
    if num_workers(strategy) > 1:
        # Each trainer worker would open its own job and read a whole
        # epoch, and FILE sharding cannot split a service's dataset.
        raise ValueError(
            "`data_service` cannot be combined with a multi-worker "
            "`strategy`: every worker would train on every example once per "
            "epoch. Use the multi-worker strategy alone (each worker reads "
            "its own shard files), or the data service with one trainer."
        )


def distributed_dataset(strategy, build, batch_size, num_files):
    """The dataset `build` makes, on `strategy`.

    Args:
        build: `build(batch_size=..., shard_policy=...)` on one worker, or
            `build(batch_size=..., shard_subset=(index, count))` for one of
            several workers' input pipelines.
        batch_size: the global batch size, or None.
        num_files: the split's shard files (the auto-shard policy's choice).
    """
    if num_workers(strategy) <= 1:
        return build(batch_size=batch_size, shard_policy=auto_shard_policy(strategy, num_files))

    # Multi-worker training: each worker's input pipeline reads its own
    # shard files, at the per-replica batch size.
    def dataset_fn(context):
        return build(
            batch_size=None
            if batch_size is None
            else context.get_per_replica_batch_size(batch_size),
            shard_subset=(context.input_pipeline_id, context.num_input_pipelines),
        )

    return strategy.distribute_datasets_from_function(dataset_fn)
