"""The official Python client (kubernetes) against the server in KUBECONFIG: create, read,
read-modify-replace, strategic-merge patch, list, watch and delete ConfigMaps, as an application
would. Prints one line per step; exits non-zero at the first step that fails."""

import sys

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

NAMESPACE = "default"


def step(name):
    print(f"ok {name}", flush=True)


def main():
    config.load_kube_config()
    core = client.CoreV1Api()

    created = core.create_namespaced_config_map(
        NAMESPACE,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py-peer"), data={"color": "red"}),
    )
    assert created.metadata.uid, "create gave no uid"
    step("create")

    read = core.read_namespaced_config_map("py-peer", NAMESPACE)
    read.data["color"] = "blue"
    replaced = core.replace_namespaced_config_map("py-peer", NAMESPACE, read)
    assert replaced.data["color"] == "blue", replaced.data
    assert replaced.metadata.resource_version != read.metadata.resource_version
    assert replaced.metadata.creation_timestamp == created.metadata.creation_timestamp
    step("read-modify-replace")

    patched = core.patch_namespaced_config_map("py-peer", NAMESPACE, {"data": {"size": "9"}})
    assert patched.data == {"color": "blue", "size": "9"}, patched.data
    step("patch")

    listed = core.list_namespaced_config_map(NAMESPACE)
    assert any(c.metadata.name == "py-peer" for c in listed.items)
    step("list")

    # A watch from the list's resourceVersion sees a new ConfigMap.
    core.create_namespaced_config_map(
        NAMESPACE,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="py-peer-2"), data={"color": "green"}),
    )
    seen = False
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_config_map,
        NAMESPACE,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=10,
    ):
        if event["type"] == "ADDED" and event["object"].metadata.name == "py-peer-2":
            seen = True
            w.stop()
    assert seen, "no ADDED event for py-peer-2"
    step("watch")

    # A list of 128 KiB or more comes gzipped when asked for; the client unpacks it.
    for i in range(100):
        core.create_namespaced_config_map(
            NAMESPACE,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=f"py-big-{i:03}"), data={"payload": "p" * 1500}
            ),
        )
    big, status, headers = core.list_namespaced_config_map_with_http_info(
        NAMESPACE, _headers={"Accept-Encoding": "gzip"}
    )
    assert status == 200, status
    assert headers.get("Content-Encoding") == "gzip", dict(headers)
    assert sum(1 for c in big.items if c.metadata.name.startswith("py-big-")) == 100
    step("gzip")

    try:
        core.create_namespaced_config_map(
            NAMESPACE, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="Not_Valid"))
        )
        raise AssertionError("an invalid name was accepted")
    except ApiException as e:
        assert e.status == 422, e.status
    step("invalid")

    core.delete_namespaced_config_map("py-peer", NAMESPACE)
    core.delete_namespaced_config_map("py-peer-2", NAMESPACE)
    step("delete")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001 - any failure ends the program with its message
        print(f"failed: {e!r}", file=sys.stderr)
        sys.exit(1)
