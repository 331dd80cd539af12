"""What a fleet container is given on this machine: its env, its Secrets' values, its volumes and ConfigMap files.

- Secrets: each key a Deployment reads (env secretKeyRef) gets a random value for the run, written as a file to
  the run volume named after the Secret, which is where a step mounting that Secret (a volume of the same name)
  reads it. `delete_secrets` removes the files when the fleet stops.
- Volumes: a PersistentVolumeClaim is the state folder's volume of that claim (FSx), a ConfigMap volume the
  Deployment's own folder in the run, holding the ConfigMap's files as applied; pod-scoped memory (/dev/shm) is
  the machine's own.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eksflow.llm.serving.fleet_pods import FleetError
from eksflow.local import PathMap


@dataclass
class ContainerInputs:
    """The run's Secret values and ConfigMaps, and how a Deployment's container sees them and the volumes."""

    state_dir: Path
    run_dir: Path
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> its files, as applied
    _secrets: dict[tuple[str, str], str] = field(default_factory=dict)  # (Secret, key) -> this run's value

    def secret(self, secret: str, key: str, value: str | None = None) -> str:
        """This run's value of a Secret key (random unless given), also written where a step mounts the Secret."""
        if (secret, key) not in self._secrets or value is not None:
            self._secrets[(secret, key)] = secrets.token_urlsafe(32) if value is None else value
            folder = self.run_dir / "volumes" / secret
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / key
            path.write_text(self._secrets[(secret, key)], encoding="utf-8")
            path.chmod(0o600)
        return self._secrets[(secret, key)]

    def env(self, container: Mapping[str, Any], where: str, given: Mapping[str, str]) -> dict[str, str]:
        """The container's env: values as written, each secretKeyRef as the run's value (`given`'s, by variable)."""
        env = {}
        for i, var in enumerate(container.get("env") or []):
            name = str(var.get("name"))
            ref = (var.get("valueFrom") or {}).get("secretKeyRef")
            if ref is not None:
                env[name] = self.secret(str(ref.get("name")), str(ref.get("key")), given.get(name))
            elif var.get("valueFrom") is not None:
                raise FleetError(f"{where} env[{i}] {name}: only values and secretKeyRef run locally", retriable=False)
            else:
                env[name] = str(var.get("value", ""))
        return env

    def mounts(self, pod: Mapping[str, Any], container: Mapping[str, Any], name: str) -> PathMap:
        """Each of the container's mount paths and the folder here it stands for."""
        volumes = {str(v.get("name")): v for v in pod.get("volumes") or []}
        pairs = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(str(mount.get("name")), {})
            path = str(mount.get("mountPath", "")).rstrip("/")
            if "persistentVolumeClaim" in volume:
                host = self.state_dir / "volumes" / str(volume["persistentVolumeClaim"]["claimName"])
            elif "configMap" in volume:
                host = self.config_folder(name)
            else:
                continue  # /dev/shm and other pod-scoped memory: the machine's own
            host.mkdir(parents=True, exist_ok=True)
            pairs.append((path, str(host)))
        return PathMap(pairs)

    def config_folder(self, name: str) -> Path:
        """Where Deployment `name`'s ConfigMap volume is on this machine."""
        return self.run_dir / "fleet" / name / "config"

    def write_config_maps(self, pod: Mapping[str, Any], name: str) -> Path:
        """Write the files of the ConfigMaps Deployment `name` mounts into its config folder; that folder."""
        folder = self.config_folder(name)
        mounted = [str((v.get("configMap") or {}).get("name")) for v in pod.get("volumes") or [] if "configMap" in v]
        missing = [m for m in mounted if m not in self.config_maps]
        if not mounted or missing:
            raise FleetError(f"the proxy {name} mounts ConfigMap {missing or '(none)'}, which was not applied first")
        folder.mkdir(parents=True, exist_ok=True)
        for config_map in mounted:
            for file_name, text in self.config_maps[config_map].items():
                (folder / file_name).write_text(text, encoding="utf-8")
        return folder

    def delete_secrets(self) -> None:
        """Remove the files of the run's Secret values."""
        for secret, key in list(self._secrets):
            (self.run_dir / "volumes" / secret / key).unlink(missing_ok=True)
