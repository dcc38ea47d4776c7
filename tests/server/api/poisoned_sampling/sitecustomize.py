"""Python imports this module at start-up when its folder is on PYTHONPATH, as the test servers
of test_request_faults.py put it: once the sampler is imported, drawing tokens raises for any
batch holding a request whose id starts with "poison" (the X-Request-Id a client sent), as a bug
in one request's sampling would. Nothing else changes, so a real `argosy serve` shows what
such a bug does to the requests beside it."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

SAMPLER = "argosy.server.worker.sampler"


def _poison(sampler) -> None:
    draw = sampler.draw

    def poisoned(probs, seqs):
        if any(seq.request_id.startswith("poison") for seq in seqs):
            raise RuntimeError("injected fault: a poisoned request")
        return draw(probs, seqs)

    sampler.draw = poisoned


class _PoisonOnImport(importlib.abc.MetaPathFinder):
    """Patches the sampler right after its module runs (importing it here, at start-up, would
    load torch and the kernels before the server has chosen how)."""

    def find_spec(self, name, path, target=None):
        if name != SAMPLER:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _poison(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PoisonOnImport())
