"""The pods: stored objects with a resourceVersion counter and a bounded event history for
watches, each pod's lifecycle on a local docker container (Pending -> Running ->
Succeeded/Failed, image missing -> ErrImagePull/ImagePullBackOff, activeDeadlineSeconds), and
deletion (graceful stop, the container removed, then the pod gone)."""

import collections
import copy
import subprocess
import threading
import time

from api_status import already_exists, bad_request, not_found, now_rfc3339, ApiError
from pod_lifecycle import run_pod
from pod_spec import new_pod

EVENT_HISTORY = 20000


class PodRecord:
    def __init__(self, pod):
        self.pod = pod
        self.container_id = None
        self.deleting = False
        self.runner_done = False
        self.finalized = False


class PodStore:
    def __init__(self, instance, docker_cli, log):
        self.instance = instance
        self.docker_cli = docker_cli
        self.log = log
        self.cond = threading.Condition()
        self.records = {}
        self.resource_version = 0
        self.events = collections.deque(maxlen=EVENT_HISTORY)

    # --- the API's view ------------------------------------------------------------------

    def _record_event(self, kind, pod):
        """Under the lock: a new resourceVersion for the pod and a watch event."""
        self.resource_version += 1
        pod["metadata"]["resourceVersion"] = str(self.resource_version)
        self.events.append((self.resource_version, kind, copy.deepcopy(pod)))
        self.cond.notify_all()

    def create(self, namespace, body):
        pod = new_pod(namespace, body)
        key = (namespace, pod["metadata"]["name"])
        with self.cond:
            if key in self.records:
                raise already_exists(key[1])
            record = PodRecord(pod)
            self.records[key] = record
            self._record_event("ADDED", pod)
            created = copy.deepcopy(pod)
        threading.Thread(target=self._run, args=(record,), daemon=True).start()
        return created

    def get(self, namespace, name):
        with self.cond:
            record = self.records.get((namespace, name))
            if record is None:
                raise not_found(name)
            return copy.deepcopy(record.pod)

    def list(self, namespace, matches):
        """Matching pods (all namespaces when namespace is None) and the list's
        resourceVersion."""
        with self.cond:
            items = [
                copy.deepcopy(r.pod)
                for (ns, _), r in sorted(self.records.items())
                if (namespace is None or ns == namespace) and matches(r.pod)
            ]
            return items, str(self.resource_version)

    def events_after(self, resource_version):
        """Events newer than resource_version; a 410 Expired when the history no longer
        reaches back that far."""
        with self.cond:
            if self.events and self.events[0][0] > resource_version + 1:
                raise ApiError(410, "Expired", f"too old resource version: {resource_version} ({self.events[0][0] - 1})")
            return [e for e in self.events if e[0] > resource_version]

    def delete(self, namespace, name, grace):
        with self.cond:
            record = self.records.get((namespace, name))
            if record is None:
                raise not_found(name)
            meta = record.pod["metadata"]
            if "deletionTimestamp" in meta:
                return copy.deepcopy(record.pod)
            if grace is None:
                grace = record.pod["spec"].get("terminationGracePeriodSeconds", 30)
            meta["deletionTimestamp"] = now_rfc3339()
            meta["deletionGracePeriodSeconds"] = grace
            self._record_event("MODIFIED", record.pod)
            record.deleting = True
            finalize_now = record.runner_done
            container_id = record.container_id
            answer = copy.deepcopy(record.pod)
        if finalize_now:
            threading.Thread(target=self._finalize, args=(record,), daemon=True).start()
        elif container_id:
            threading.Thread(target=self._stop, args=(container_id, grace), daemon=True).start()
        return answer

    def exec_target(self, namespace, name, container):
        """The running container an exec goes to; 404 for a missing pod, 400 as the apiserver
        answers for a wrong container name or a container that is not running."""
        with self.cond:
            record = self.records.get((namespace, name))
            if record is None:
                raise not_found(name)
            spec_container = record.pod["spec"]["containers"][0]
            if container and container != spec_container["name"]:
                raise bad_request(f"container {container} is not valid for pod {name}")
            if record.pod["status"]["phase"] != "Running" or not record.container_id:
                raise bad_request(f"unable to upgrade connection: container not found (\"{spec_container['name']}\")")
            return record.container_id

    # --- docker --------------------------------------------------------------------------

    def docker(self, args, timeout=120):
        return subprocess.run([self.docker_cli] + args, capture_output=True, text=True, timeout=timeout)

    def _stop(self, container_id, grace):
        try:
            if grace and grace > 0:
                self.docker(["stop", "-t", str(int(grace)), container_id], timeout=grace + 60)
            else:
                self.docker(["kill", container_id], timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.log(f"stopping {container_id}: {e}")

    def _finalize(self, record):
        with self.cond:
            if record.finalized:
                return
            record.finalized = True
            container_id = record.container_id
        if container_id:
            try:
                self.docker(["rm", "-f", container_id], timeout=120)
            except (OSError, subprocess.TimeoutExpired) as e:
                self.log(f"removing {container_id}: {e}")
        with self.cond:
            meta = record.pod["metadata"]
            self.records.pop((meta["namespace"], meta["name"]), None)
            self._record_event("DELETED", record.pod)

    def remove_all_containers(self):
        """Every container this instance started (SIGTERM/SIGINT)."""
        listed = self.docker(["ps", "-aq", "--filter", f"label=swerve.k8s-standin.instance={self.instance}"])
        ids = listed.stdout.split()
        if ids:
            self.docker(["rm", "-f"] + ids, timeout=300)
        return len(ids)

    # --- the lifecycle -------------------------------------------------------------------

    def _update(self, record, change):
        with self.cond:
            if record.finalized:
                return
            change(record.pod["status"], record.pod["spec"]["containers"][0])
            self._record_event("MODIFIED", record.pod)

    def _run(self, record):
        started = time.monotonic()
        try:
            run_pod(self, record, started)
        except Exception as e:  # a docker CLI that vanished: the pod fails, the server lives
            self.log(f"pod {record.pod['metadata']['name']}: {e!r}")
            self._update(record, lambda s, c: s.update(phase="Failed", reason="StandinError", message=str(e)))
        with self.cond:
            record.runner_done = True
            finalize = record.deleting
        if finalize:
            self._finalize(record)

