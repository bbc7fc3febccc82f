"""In CI every PostgreSQL variant runs (issue 30 item 7): a test project using this suite's conftest, with
PostgreSQL unreachable, fails each PostgreSQL variant under ``CI`` with one clear sentence (never a
skip, never a connection traceback), and elsewhere skips each with the reason printed in the summary.
The variants: the ``backend`` fixture's ``postgresql`` parameter, a test that parametrizes ``backend``
itself, a test marked ``postgres``, and a test on a private cluster (``pg_cluster``) on a machine
without PostgreSQL's server binaries."""

from __future__ import annotations

import pytest

from tests.servers import ROOT

CONFTEST = '''
import tests.pgcluster
import tests.storekit

tests.storekit.PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:1/test"  # nothing listens on port 1
tests.pgcluster.unavailable = lambda: "PostgreSQL's server binaries (initdb, pg_ctl) are not installed"

from tests.conftest import backend, pg_cluster, pytest_collection_modifyitems, pytest_runtest_setup  # noqa: E402,F401
'''

TESTS = '''
import pytest


def test_a_store(backend):
    assert backend.kind == "sqlite"


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_only_postgresql(backend):
    raise AssertionError("never reached")


@pytest.mark.postgres
def test_marked():
    raise AssertionError("never reached")


def test_private_cluster(pg_cluster):
    raise AssertionError("never reached")
'''

INI = "[pytest]\nmarkers =\n    postgres: needs PostgreSQL\naddopts = -rfEs\n"


def run(pytester: pytest.Pytester, ci: bool) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_variants=TESTS)
    pytester.makeini(INI)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(ROOT))
        if ci:
            mp.setenv("CI", "1")
        else:
            mp.delenv("CI", raising=False)
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly")


def test_in_ci_an_unreachable_postgresql_fails_every_postgresql_variant_with_a_clear_message(
        pytester: pytest.Pytester) -> None:
    result = run(pytester, ci=True)
    result.assert_outcomes(passed=1, errors=4)
    out = result.stdout.str()
    assert out.count("CI is set and PostgreSQL at 127.0.0.1:1 (database 'test') is unreachable") >= 3, out
    assert "CI is set and PostgreSQL's server binaries (initdb, pg_ctl) are not installed" in out, out
    assert "CI runs every PostgreSQL test" in out
    assert "never reached" not in out  # no test body ran against a missing database
    assert "Traceback" not in out


def test_outside_ci_each_postgresql_variant_is_skipped_with_the_reason_in_the_summary(
        pytester: pytest.Pytester) -> None:
    result = run(pytester, ci=False)
    result.assert_outcomes(passed=1, skipped=4)
    out = result.stdout.str()
    assert "PostgreSQL at 127.0.0.1:1 (database 'test') is unreachable" in out, out
    assert "server binaries (initdb, pg_ctl) are not installed" in out, out
