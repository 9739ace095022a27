"""One pod's life on a local docker container, as a kubelet reports it: the image looked up
locally (never pulled: a missing one is ErrImagePull, then ImagePullBackOff), `docker run -d`,
Running until the container exits (Succeeded on 0, else Failed; OOMKilled as such), and
`activeDeadlineSeconds` counted from the pod's start (the container killed, phase Failed,
reason DeadlineExceeded). A deletion ends the wait; the store then removes the container."""

import subprocess
import time

from api_status import now_rfc3339
from pod_spec import run_args, waiting_status

POLL_S = 0.25
BACKOFF_MAX_S = 5.0


def _deadline_passed(pod, started):
    deadline = pod["spec"].get("activeDeadlineSeconds")
    return deadline is not None and time.monotonic() - started >= deadline


def _remaining(pod, started):
    deadline = pod["spec"].get("activeDeadlineSeconds")
    return None if deadline is None else max(0.0, deadline - (time.monotonic() - started))


def _set_waiting(reason, message):
    def change(status, container):
        status["containerStatuses"] = [waiting_status(container, reason, message)]

    return change


def _fail_deadline(status, container):
    status.update(
        phase="Failed",
        reason="DeadlineExceeded",
        message="Pod was active on the node longer than the specified deadline",
    )
    for condition in status["conditions"]:
        if condition["type"] in ("Ready", "ContainersReady"):
            condition.update(status="False", reason="PodFailed", lastTransitionTime=now_rfc3339())


def _wait_for_image(store, record, started):
    """True when the image is present locally; False when the pod was deleted or ran out of
    time first."""
    image = record.pod["spec"]["containers"][0]["image"]
    backoff, attempts = 1.0, 0
    while not record.deleting:
        if store.docker(["image", "inspect", image], timeout=60).returncode == 0:
            return True
        attempts += 1
        reason = "ErrImagePull" if attempts == 1 else "ImagePullBackOff"
        message = (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": '
            "the k8s stand-in never pulls; the image is not in the local docker daemon"
            if attempts == 1
            else f'Back-off pulling image "{image}"'
        )
        if attempts <= 2:
            store._update(record, _set_waiting(reason, message))
        until = time.monotonic() + backoff
        while time.monotonic() < until and not record.deleting:
            if _deadline_passed(record.pod, started):
                return False
            time.sleep(POLL_S)
        backoff = min(backoff * 2, BACKOFF_MAX_S)
    return False


def _start_container(store, record):
    """The container's id, or None after marking the pod failed to start."""
    out = store.docker(run_args(record.pod, store.instance), timeout=300)
    if out.returncode != 0:
        message = out.stderr.strip() or f"docker run exited {out.returncode}"
        listed = store.docker(["ps", "-aq", "--filter", "label=swerve.k8s-standin.pod=" + _pod_key(record.pod)])
        with store.cond:
            record.container_id = (listed.stdout.split() or [None])[0]

        def start_error(status, container):
            terminated = {"exitCode": 128, "reason": "StartError", "message": message, "finishedAt": now_rfc3339()}
            status["containerStatuses"] = [dict(waiting_status(container, ""), state={"terminated": terminated})]
            status["phase"] = "Failed"

        store._update(record, start_error)
        return None
    container_id = out.stdout.strip()
    with store.cond:
        record.container_id = container_id

    def running(status, container):
        now = now_rfc3339()
        status["phase"] = "Running"
        status["podIP"] = "127.0.0.1"
        status["conditions"] = status["conditions"][:1] + [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("Initialized", "ContainersReady", "Ready")
        ]
        status["containerStatuses"] = [
            dict(
                waiting_status(container, ""),
                state={"running": {"startedAt": now}},
                ready=True,
                started=True,
                containerID=f"docker://{container_id}",
                imageID=f"docker-pullable://{container['image']}",
            )
        ]

    store._update(record, running)
    return container_id


def _pod_key(pod):
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _wait_for_exit(store, record, container_id, started):
    """Until the container exits, the deadline passes (it is killed) or the pod is deleted."""
    waiter = subprocess.Popen(
        [store.docker_cli, "wait", container_id], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while waiter.poll() is None:
            if record.deleting:
                # The deleter stops the container within its grace period; the store removes
                # it once this runner is done (a stop that failed ends the wait too).
                grace = record.pod["metadata"].get("deletionGracePeriodSeconds") or 0
                _quiet_wait(waiter, grace + 30)
                return "deleted"
            if _deadline_passed(record.pod, started):
                store.docker(["kill", container_id], timeout=60)
                return "deadline"
            time.sleep(POLL_S)
        return "exited"
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.wait()


def _quiet_wait(process, timeout):
    """False when the process is still running after timeout seconds."""
    try:
        process.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _terminated(store, record, container_id):
    fmt = "{{.State.ExitCode}} {{.State.OOMKilled}} {{.State.StartedAt}} {{.State.FinishedAt}}"
    out = store.docker(["inspect", "-f", fmt, container_id], timeout=60)
    fields = out.stdout.split()
    if out.returncode != 0 or len(fields) != 4:
        return {"exitCode": 137, "reason": "Error", "message": out.stderr.strip()}
    code = int(fields[0])
    reason = "OOMKilled" if fields[1] == "true" else ("Completed" if code == 0 else "Error")
    return {
        "exitCode": code,
        "reason": reason,
        "startedAt": fields[2][:19] + "Z",
        "finishedAt": fields[3][:19] + "Z",
        "containerID": f"docker://{container_id}",
    }


def run_pod(store, record, started):
    store._update(record, lambda status, container: status.update(startTime=now_rfc3339()))
    if not _wait_for_image(store, record, started):
        if not record.deleting:
            store._update(record, _fail_deadline)
        return
    if record.deleting:
        return
    container_id = _start_container(store, record)
    if container_id is None or record.deleting:
        return
    ending = _wait_for_exit(store, record, container_id, started)
    if ending == "deleted":
        return
    terminated = _terminated(store, record, container_id)

    def finished(status, container):
        status["containerStatuses"][0].update(state={"terminated": terminated}, ready=False, started=False)
        for condition in status["conditions"]:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition.update(status="False", reason="PodCompleted" if terminated["exitCode"] == 0 else "PodFailed")
        if ending == "deadline":
            _fail_deadline(status, container)
        else:
            status["phase"] = "Succeeded" if terminated["exitCode"] == 0 else "Failed"

    store._update(record, finished)
