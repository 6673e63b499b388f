"""The service designs compared by ``benchmarks/generator_service_cpu.py`` (see its
docstring), and the Open MPI settings each runs with."""
from __future__ import annotations

import time

DESIGNS = ("none", "nap", "recv", "recv-yield", "recv-nanosleep", "current",
           "current-nobell")
TAG_REQUEST, TAG_REPLY = 0x5251, 0x5252


def service_classes():
    """Service classes of the designs, by name (defined here: they subclass
    ``GeneratorService``, which imports MPI, and only the jobs need them)."""
    from mpi4py import MPI

    from ripples.schedule.service import GeneratorService

    class _Handling(GeneratorService):
        def _handle(self, op, rank, request_id):
            if op == "groups":
                self.generator.request(rank)
                self._request_ids[rank] = request_id
            else:  # "close"
                self.closed.add(rank)
                self._request_ids.pop(rank, None)
                self._send(rank, ("ok", self.generator.leave(rank), request_id))
            for worker, pairs in self.generator.poll().items():
                self._send(worker, ("ok", pairs, self._request_ids.pop(worker)))
            self._sends = [req for req in self._sends if not req.Test()]

        def _send(self, rank, message):
            self._sends.append(self.comm.isend(message, dest=rank, tag=TAG_REPLY))

    class NapService(_Handling):
        """The former loop: improbe, then naps of 100 us doubling to 500 us."""

        def _run(self):
            nap = 1e-4
            try:
                while len(self.closed) < self.comm.Get_size():
                    msg = self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST)
                    if msg is not None:
                        self._handle(*msg.recv())
                        nap = 1e-4
                        continue
                    self._sends = [req for req in self._sends if not req.Test()]
                    time.sleep(nap)
                    nap = min(5e-4, nap * 2)
                MPI.Request.Waitall(self._sends)
            except BaseException as exc:
                self.error = exc

    class RecvService(_Handling):
        """A blocking receive of every request (no deadlines needed with policy "all")."""

        def _run(self):
            try:
                while len(self.closed) < self.comm.Get_size():
                    self._handle(*self.comm.recv(source=MPI.ANY_SOURCE, tag=TAG_REQUEST))
                MPI.Request.Waitall(self._sends)
            except BaseException as exc:
                self.error = exc

    return {"nap": NapService, "recv": RecvService, "recv-yield": RecvService,
            "recv-nanosleep": RecvService, "current": GeneratorService,
            "current-nobell": GeneratorService}


def design_env(design: str, nanosleep_us: float) -> dict:
    """The Open MPI variables a design's job runs with (every design sets the yield)."""
    env = {"OMPI_MCA_mpi_yield_when_idle": "1" if design in ("recv-yield", "recv-nanosleep")
           else "0"}
    if design == "recv-nanosleep":
        env["OMPI_MCA_threads_pthreads_yield_strategy"] = "nanosleep"
        env["OMPI_MCA_threads_pthreads_nanosleep_time"] = str(int(nanosleep_us * 1e3))
    return env

