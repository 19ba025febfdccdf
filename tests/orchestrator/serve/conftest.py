"""The serve tests' fixtures: the scripted mock backend (tests/_serve_world.py), the set-up serving
it, and a server of it in a thread."""
import pytest

from _serve_world import ANSWER, ENDLESS, FAILING, QUESTION, ScriptedBackend, serve_mock
from orchestrator.serve import Background, ServeLimits, create_app


@pytest.fixture(scope="module")
def backend():
    with ScriptedBackend(answers={QUESTION: ANSWER, ENDLESS: "42", FAILING: "-"}, fail={FAILING}) as server:
        yield server


@pytest.fixture(scope="module")
def served(backend, tmp_path_factory):
    with serve_mock(backend, tmp_path_factory.mktemp("serve")) as out:
        yield out


@pytest.fixture()
def server(served, backend):
    backend.bodies.clear()
    backend.delay_s = 0.0
    with Background(create_app(served[0], ServeLimits(concurrency=4, queue=4))) as srv:
        yield srv
