"""The fleet's objects as one list: each applied after what it needs, and serving.yaml guarded before its pods."""

from eksflow.llm.serving.apply_order import fleet_objects
from eksflow.llm.serving.rollout import gitops_objects
from tests.flagship import config

FLEET, MODEL_DIR = "llama-lora-vllm-0123abcd", "/fsx/models/smollm2-135m-instruct"


def test_each_object_is_applied_after_an_earlier_one_and_only_the_engine_is_awaited():
    listed = fleet_objects(config(), FLEET, MODEL_DIR)
    tasks = [obj.task for obj in listed]
    assert len(set(tasks)) == len(tasks)  # one workflow task each
    for i, obj in enumerate(listed):
        assert obj.after in ("", *tasks[:i]), obj.task  # a loop over the list has applied what it follows
    by_task = {obj.task: obj for obj in listed}
    assert by_task["proxy"].after == "proxy-config"  # the proxy mounts its ConfigMap
    # The engine's task waits for a pod that generates; the proxy's cannot (ready only once a route exists).
    assert [obj.task for obj in listed if obj.awaited] == ["vllm"]
    assert by_task["vllm"].manifest["metadata"]["name"] == FLEET


def test_serving_yaml_puts_the_network_policies_before_the_pods_they_guard():
    cfg = config()
    kinds = [obj["kind"] for obj in gitops_objects(cfg)]
    assert kinds[:2] == ["NetworkPolicy", "NetworkPolicy"]
    assert "NetworkPolicy" not in kinds[2:]
    rest = [o for o in fleet_objects(cfg, FLEET, MODEL_DIR) if o.manifest["kind"] != "NetworkPolicy"]
    assert kinds[2:] == [o.manifest["kind"] for o in rest]  # the others in the rollout's order
