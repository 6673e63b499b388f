"""The exceptions ripples raises. User-input mistakes raise the standard TypeError or
ValueError naming the argument; failures of the distributed job raise RipplesError."""


class RipplesError(RuntimeError):
    """A distributed operation failed: members disagreed, a peer vanished, or a wait timed out."""


class NotInitializedError(RipplesError):
    """An operation was used before ``ripples.torch.init()``."""


class RipplesTimeoutError(RipplesError, TimeoutError):
    """A blocking wait exceeded ``Config.timeout_s`` (``RIPPLES_TIMEOUT_S``).

    ``missing``: the world ranks the wait was for, where known (empty otherwise).
    ``finding``: what asking those ranks found (``ripples.comm.liveness``), or "".
    """

    def __init__(self, *args, missing=()):
        super().__init__(*args)
        self.missing = tuple(missing)
        self.finding = ""


class MismatchError(RipplesError):
    """Members of one collective called it with different shapes, dtypes, ops or groups."""
