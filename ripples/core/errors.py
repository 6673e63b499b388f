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


class PeersSilentError(RipplesTimeoutError):
    """A wait timed out and ``silent`` (world ranks) did not answer a liveness check: dead,
    frozen, or cut off by the network. Under ``Config.fault_tolerant`` the ranks that can
    still reach each other go on without them when they are a majority."""

    def __init__(self, *args, missing=(), silent=()):
        super().__init__(*args, missing=missing)
        self.silent = tuple(silent)


class RanksFailedError(RipplesError):
    """Ranks died, and the survivors have already moved onto a smaller world
    (``Config.fault_tolerant``): the operation that raised it did not complete, and
    ``size()``/``rank()`` now report the new world. Horovod's ``HorovodInternalError``.

    ``failed``: ranks of the previous world that died. ``size``, ``rank``: this rank's new
    world. ``generation``: how many recoveries this job has made.
    """

    def __init__(self, *args, failed=(), size=0, rank=0, generation=0):
        super().__init__(*args)
        self.failed = tuple(failed)
        self.size = size
        self.rank = rank
        self.generation = generation


class MismatchError(RipplesError):
    """Members of one collective called it with different shapes, dtypes, ops or groups."""
