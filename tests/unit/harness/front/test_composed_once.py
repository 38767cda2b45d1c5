"""harness.front.composed_once: a sweep composes each job once, and hands the launcher that config."""

import pytest

from kvbench.harness.front.composed_once import ComposedOnce


def test_a_job_composed_by_the_check_is_handed_to_the_launcher_once_not_composed_again():
    class Loader:
        def __init__(self):
            self.calls = []

        def load_sweep_config(self, master, overrides):
            self.calls.append(list(overrides))
            if "bad=1" in overrides:
                raise AssertionError("does not compose")
            return {"overrides": list(overrides), "n": len(self.calls)}

        def get_sources(self):
            return "sources"

    loader = Loader()
    once = ComposedOnce(loader)
    once.compose("master", ("a=1",))
    with pytest.raises(AssertionError):
        once.compose("master", ["bad=1"])
    first = once.load_sweep_config("master", ["a=1"])  # the launcher's compose of the checked job
    assert first == {"overrides": ["a=1"], "n": 1} and loader.calls == [["a=1"], ["bad=1"]]
    again = once.load_sweep_config("master", ["a=1"])  # kept once: a second ask composes afresh
    assert again["n"] == 3 and again is not first
    assert once.get_sources() == "sources"  # everything else is the loader's
