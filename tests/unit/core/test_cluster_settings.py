"""`cluster.launcher` names a registered launcher; `cluster.backoff_limit` still answers to its old name."""

import pytest

from eksflow.config import load_config
from eksflow.errors import ConfigError
from pipelines.llama_lora import LlamaLoraConfig


def test_the_old_backoff_limit_name_is_read_with_one_deprecation_line(capsys):
    cfg = load_config(LlamaLoraConfig, None, ["cluster.rayjob_backoff_limit=3"])
    assert cfg.cluster.backoff_limit == 3
    assert capsys.readouterr().err == (
        "warning: cluster.rayjob_backoff_limit is deprecated; use cluster.backoff_limit\n"
    )


def test_the_old_and_new_backoff_limit_names_together_are_refused():
    with pytest.raises(ConfigError, match=r"rayjob_backoff_limit is the old name of backoff_limit; give only"):
        load_config(LlamaLoraConfig, None, ["cluster.rayjob_backoff_limit=3", "cluster.backoff_limit=2"])


def test_an_unregistered_launcher_is_refused_naming_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        load_config(LlamaLoraConfig, None, ["cluster.launcher=pbs"])
    assert (
        "cluster.launcher: Value error, no launcher 'pbs'; registered: container, mpijob, rayjob, slurm, trainjob, "
        "volcano" in (str(err.value))
    )
