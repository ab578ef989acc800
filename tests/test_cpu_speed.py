"""The CPU speed defaults (model_zoo_lenet/src/cpu_speed.py): what they set, and the switch that turns them off."""
import json
import os
import subprocess
import sys

import pytest

import mindspore as ms

from helpers import ZOO
from src import cpu_speed

PROBE = ("import json, sys; sys.path.insert(0, {zoo!r}); from src import cpu_speed; isa = "
         "cpu_speed.apply_env_defaults(); import mindspore as ms; ms.set_device('CPU'); cpu_speed.set_mode({mode!r}); "
         "from mindspore._c_expression import RuntimeConf; print(json.dumps({{'isa': isa, 'mode': "
         "ms.get_context('mode'), 'blocking': RuntimeConf.get_instance().is_launch_blocking()}}))")


def _probe(mode, **env):
    """apply_env_defaults and set_mode(mode) in a fresh process; what they left in force."""
    environ = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "MS_ACCUM_CPU_DEFAULTS")}
    out = subprocess.run([sys.executable, "-c", PROBE.format(zoo=ZOO, mode=mode)], env=dict(environ, **env),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_onednn_isa_default_keeps_a_users_choice(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("MS_ACCUM_CPU_DEFAULTS", raising=False)
    assert cpu_speed.apply_env_defaults() == "AVX2" and os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert cpu_speed.apply_env_defaults() == "AVX512_CORE"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("MS_ACCUM_CPU_DEFAULTS", "mindspore")
    assert cpu_speed.apply_env_defaults() is None and "ONEDNN_MAX_CPU_ISA" not in os.environ


def test_set_mode_names_a_bad_mode():
    with pytest.raises(ValueError, match=r"'mode' must be 'graph' or 'pynative', but got 'eager'"):
        cpu_speed.set_mode("eager")


@pytest.mark.slow
@pytest.mark.parametrize("mode, env, expected", [
    ("pynative", {}, {"isa": "AVX2", "mode": ms.PYNATIVE_MODE, "blocking": True}),
    ("graph", {}, {"isa": "AVX2", "mode": ms.GRAPH_MODE, "blocking": False}),
    ("pynative", {"MS_ACCUM_CPU_DEFAULTS": "mindspore"}, {"isa": None, "mode": ms.PYNATIVE_MODE, "blocking": False}),
])
def test_pynative_on_cpu_launches_synchronously_unless_switched_off(mode, env, expected):
    assert _probe(mode, **env) == expected
