"""The Trainium entrypoint refuses to run without optimum-neuron, with a line that says where it does run."""

from eksflow.llm.steps import train_neuron


def test_without_optimum_neuron_exits_2_with_the_fix(tmp_path, capsys):
    argv = [
        f"--dataset-dir={tmp_path}",
        "--base-model=smollm2-135m-instruct",
        f"--output-dir={tmp_path / 'out'}",
        f"--outputs-dir={tmp_path / 'outputs'}",
    ]
    assert train_neuron.main(argv) == 2
    err = capsys.readouterr().err
    assert "optimum-neuron" in err and "eksflow.llm.steps.train" in err
    assert not (tmp_path / "outputs").exists()


def test_dpo_is_refused_on_trainium_in_one_line(tmp_path, capsys):
    argv = [
        f"--dataset-dir={tmp_path}",
        "--base-model=smollm2-135m-instruct",
        f"--output-dir={tmp_path / 'out'}",
        f"--outputs-dir={tmp_path / 'outputs'}",
        "--method=dpo",
    ]
    assert train_neuron.main(argv) == 2
    assert "train.method=dpo: the Trainium step trains with NeuronTrainer, supervised only" in capsys.readouterr().err
