"""The engine's exception classes. Each message names what to fix: the file, tensor or field."""


class FucinaError(Exception):
    """Base class for every error the engine raises on bad input."""


class GGUFError(FucinaError):
    """A GGUF file that is missing, truncated, corrupt or malformed."""


class ConfigError(FucinaError):
    """Model metadata that is missing or invalid (spec 13.3: InvalidConfig / MissingMetadata)."""


class UnsupportedArchitecture(FucinaError):
    """`general.architecture` names a family the engine does not implement."""


class WeightShapeError(FucinaError):
    """A tensor's shape disagrees with what the model config predicts."""


class UnsupportedWeightType(FucinaError):
    """A tensor's GGML type has no kernel path."""


class KvCacheError(FucinaError):
    """Base for KV cache errors."""


class KvCacheOverflow(KvCacheError):
    """Appending would exceed the cache capacity."""


class KvCacheShapeMismatch(KvCacheError):
    """Rows or caches whose geometry disagrees with the cache's."""


class KvCacheHeadDimNotBlockAligned(KvCacheError):
    """A q8_0 cache needs head_dim to be a multiple of 32."""


class ModelNotFound(FucinaError):
    """A model name that is neither a starter model nor an existing .gguf path."""


class ModelDownloadError(FucinaError):
    """A starter model could not be downloaded, extracted or verified."""


class DownloadCancelled(ModelDownloadError):
    """A model download stopped because its cancel event was set; pulling again resumes it."""


class TokenizerError(FucinaError):
    """Tokenizer metadata that is missing, malformed or of a kind the engine does not implement."""
