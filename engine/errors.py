"""The engine's exception classes. Each message names what to fix: the file, tensor or field."""


class FucinaError(Exception):
    """Base class for every error the engine raises on bad input."""


class GGUFError(FucinaError):
    """A GGUF file that is missing, truncated, corrupt or malformed."""


class ConfigError(FucinaError):
    """Model metadata that is missing or invalid (spec 13.3: InvalidConfig / MissingMetadata)."""


class UnsupportedArchitecture(FucinaError):
    """`general.architecture` names a family the engine does not implement."""


class UnsupportedOnBackend(FucinaError):
    """The model needs an op the chosen compute backend does not have (a family on the wgpu backend)."""


class WeightShapeError(FucinaError):
    """A tensor's shape disagrees with what the model config predicts."""


class UnsupportedWeightType(FucinaError):
    """A tensor's GGML type has no kernel path."""


class SlowWeightTypeWarning(UserWarning):
    """A model's weights include a type its backend multiplies through the generic path (correct, slower)."""


class InvalidTokenId(FucinaError):
    """A token id given by the caller that is not in the model's vocabulary."""


class KvCacheError(FucinaError):
    """Base for KV cache errors."""


class KvCacheOverflow(KvCacheError):
    """Appending would exceed the cache capacity."""


class KvCacheShapeMismatch(KvCacheError):
    """Rows or caches whose geometry disagrees with the cache's."""


class KvCacheHeadDimNotBlockAligned(KvCacheError):
    """A q8_0 cache needs head_dim to be a multiple of 32."""


class KvDtypeUnsupported(KvCacheError):
    """The backend the model runs on does not keep KV caches of this type."""


class KvSidecarLocked(KvCacheError):
    """A KV sidecar that another process kept locked for longer than a write takes."""


class ModelTooLarge(FucinaError):
    """A model whose weights this machine's memory cannot hold (refused before loading)."""


class ModelNotFound(FucinaError):
    """A model name that is neither a starter model nor an existing .gguf path."""


class ModelDownloadError(FucinaError):
    """A starter model could not be downloaded, extracted or verified."""


class DownloadCancelled(ModelDownloadError):
    """A model download stopped because its cancel event was set; pulling again resumes it."""


class ModelFileDamaged(ModelDownloadError):
    """A downloaded starter model's file that cannot be used as it is: changed since it was verified
    (its size or SHA-256 no longer matches the catalog) or unreadable."""


class TokenizerError(FucinaError):
    """Tokenizer metadata that is missing, malformed or of a kind the engine does not implement."""


class InvalidSamplerConfig(FucinaError):
    """A sampler setting outside its range (temperature, top-k, top-p, min-p, penalties)."""


class AllTokensMasked(FucinaError):
    """No token is left to sample: a logit processor masked every one (or the logits are all NaN)."""


class NonFiniteLogits(FucinaError):
    """The model computed NaN or Inf logits (an overflow in a broken model): nothing can be sampled."""


class InvalidGrammar(FucinaError):
    """A reply grammar (JSON schema, regex, Lark, GBNF) that does not compile; the message is llguidance's."""


class ReplyBudgetTooSmall(InvalidGrammar):
    """The reply's token limit is below the shortest document its grammar allows."""


class ChatTemplateError(FucinaError):
    """A chat that the template cannot render, or a model's own Jinja template that fails or runs away."""


class EmptyMessages(ChatTemplateError):
    """Rendering an empty message list."""


class TrailingAssistantMessage(ChatTemplateError):
    """A history that ends with an assistant message: rendering would open a second assistant turn."""


class SystemMidConversation(ChatTemplateError):
    """A system message after the conversation started, in a format with a single system slot (Gemma)."""


class ContextFull(FucinaError):
    """The conversation no longer fits the KV cache (its context size)."""


class InvalidContextPolicy(FucinaError):
    """A conversation's context_policy setting that names no policy (engine.context_policy.POLICIES)."""


class InvalidPrefix(FucinaError):
    """A preloaded KV prefix declared on a conversation that is not fresh or whose cache disagrees."""


class KvPersistTokenMismatch(KvCacheError):
    """A KV sidecar append whose prefix rows and tokens do not describe the cache's positions."""


class SpeculativeError(FucinaError):
    """Base for speculative-decoding errors (spec 13.9)."""


class InvalidSpeculationConfig(SpeculativeError):
    """A speculative-decoding setting outside its range (draft budgets, gate windows, the cost table)."""


class InvalidDecodeState(SpeculativeError):
    """A speculative step whose cache and history disagree (the step needs the cache to hold every committed
    token but the last); call bootstrap() after each prefill."""


class SamIndexError(SpeculativeError):
    """A suffix-automaton index that cannot take an append: frozen, poisoned by a failed append, or full."""


class HistoryError(FucinaError):
    """A history operation on a missing conversation or message, or an import or setting that is malformed."""


class StoreError(FucinaError):
    """The history database or a sidecar could not be written (or opened); what was committed before is intact."""


class StorageFull(StoreError):
    """The disk holding the data dir is full (or a file size limit was reached)."""


class StorageReadOnly(StoreError):
    """The data dir or its history.db cannot be written: read-only, immutable or not permitted."""


class DataDirInUse(FucinaError):
    """Another Fucina app already runs on this data dir (its single-instance lock is held)."""


class ConversationBusy(FucinaError):
    """A reply is being written into this conversation by another session or process."""


class SpeculationMismatch(SpeculativeError):
    """A speculative decode that committed other tokens than the plain decode of the same prompt: a bug in
    the lossless contract, never a setting (the benchmark checks it on every run)."""


class BenchWorkloadError(FucinaError):
    """A benchmark workload file that cannot be read or lacks a field (which file, which field)."""


class DocumentError(FucinaError):
    """An attached document that cannot be read as text (which file, and why)."""


class DocumentUnreadable(DocumentError):
    """A document file that is missing, unreadable, or a damaged PDF or DOCX."""


class DocumentTooLarge(DocumentError):
    """A document file larger than the reader takes."""


class EncryptedDocument(DocumentError):
    """A password-protected PDF."""


class ImageOnlyDocument(DocumentError):
    """A PDF whose pages carry no text layer (scanned images): there is nothing to read without OCR."""


class BinaryDocument(DocumentError):
    """A file that is not text in any encoding (an executable, an image, an archive)."""


class EmptyDocument(DocumentError):
    """A document with no text in it (a zero-byte file, only whitespace)."""


class CartridgeError(FucinaError):
    """Base for errors of documents served as KV cartridges (spec 13.10)."""


class CartridgeRefused(CartridgeError):
    """A stored cartridge that is damaged, or was built for another model, cache type or geometry; the caller
    builds it again."""


class CartridgeCancelled(CartridgeError):
    """Building a cartridge stopped because its cancel event was set; nothing was stored."""


class DocumentTooLong(CartridgeError):
    """A document whose tokens do not fit the model's (or the chat's) context."""


class RemoteError(FucinaError):
    """Base for errors of a remote OpenAI-compatible endpoint used as the model (engine.serving.remote)."""


class RemoteUnreachable(RemoteError):
    """The endpoint's host refused the connection, does not resolve, or failed the TLS handshake."""


class RemoteTimeout(RemoteError):
    """The endpoint accepted the request but sent nothing for longer than the read timeout."""


class RemoteAuthFailed(RemoteError):
    """The endpoint refused the API key (HTTP 401 or 403)."""


class RemoteModelNotFound(RemoteError):
    """The endpoint does not serve the model asked for (HTTP 404 on a completion, or absent from /v1/models)."""


class RemoteRefused(RemoteError):
    """The endpoint answered a request with an error (its message is quoted), or with something that is not
    an OpenAI-shaped reply."""


class RemoteConnectionLost(RemoteError):
    """A streamed reply that stopped before its end (the connection broke or the server went away): the text
    received until then is in `partial`."""

    def __init__(self, message: str, partial: str = ""):
        super().__init__(message)
        self.partial = partial
