"""The README is a front page whose set-up commands are the ones CI runs; every setting is
documented under its flag in the docs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_exactly_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert test_command in ci_lines


def test_readme_run_command_uses_the_installed_cli():
    run_command = readme_commands()[0]
    assert run_command.endswith("argosy serve")
    # Torch first, then the project built against it: the install compiles the CPU kernels (setup.py).
    install = "pip install torch==2.13.0 setuptools ninja && pip install --no-build-isolation -e "
    assert run_command.startswith(install + ". ")
    assert install + "'.[test]'" in next(c for c in readme_commands() if "pytest" in c)


def test_every_setting_is_documented_under_its_flag():
    from argosy.flags import flag_name, settings_of
    from argosy.operator.main import OperatorOptions
    from argosy.operator.model_cache.agent.main import AgentOptions
    from argosy.server.api.server_config import ServerConfig
    from argosy.server.engine_config import EngineConfig

    pages = [path.read_text() for path in (ROOT / "docs").rglob("*.md")]
    rows = [line for page in pages for line in page.splitlines() if line.startswith("| `")]
    for cls in (EngineConfig, ServerConfig, OperatorOptions, AgentOptions):
        for field in settings_of(cls):
            flag = flag_name(field)
            documented = (f"`{flag}`", f"`{flag.replace('--', '--[no-]', 1)}`")
            assert any(name in row for row in rows for name in documented), f"{cls.__name__}.{field.name}"


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target
