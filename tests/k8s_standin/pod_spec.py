"""A created pod's validation and defaults, and its container's `docker run` arguments."""

import re
import secrets
import uuid

from api_status import bad_request, invalid, now_rfc3339

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^([+]?[0-9]+(\.[0-9]*)?|\.[0-9]+)(e[+-]?[0-9]+|E[+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
NODE_NAME = "k8s-standin"


def parse_quantity(text, field):
    """A resource.Quantity ("512Mi", "0.5", "500m", "1e3") as a float; else a 400 naming the
    field, as the apiserver's decoder answers."""
    text = str(text).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise bad_request(
            f"Pod in version \"v1\" cannot be handled as a Pod: quantities must match the "
            f"regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' ({field}: {text!r})"
        )
    number, suffix = match.group(1), match.group(3) or ""
    if suffix[:1] in ("e", "E"):
        return float(number + suffix)
    return float(number) * _SUFFIX[suffix]


def _validate(name, body):
    spec = body.get("spec")
    causes = []
    if not name:
        causes.append(("metadata.name", "FieldValueRequired", "Required value: name or generateName is required"))
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        causes.append(("metadata.name", "FieldValueInvalid", f"Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"))
    if not isinstance(spec, dict):
        causes.append(("spec", "FieldValueRequired", "Required value"))
        return causes
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(("spec.containers", "FieldValueRequired", "Required value"))
        return causes
    if len(containers) > 1 or spec.get("initContainers"):
        causes.append(("spec.containers", "FieldValueNotSupported", "Unsupported value: the k8s stand-in runs exactly one container per pod and no init containers"))
    for i, container in enumerate(containers):
        if not isinstance(container, dict):
            causes.append((f"spec.containers[{i}]", "FieldValueInvalid", "Invalid value: not an object"))
            continue
        if not container.get("name"):
            causes.append((f"spec.containers[{i}].name", "FieldValueRequired", "Required value"))
        if not container.get("image"):
            causes.append((f"spec.containers[{i}].image", "FieldValueRequired", "Required value"))
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline <= 0):
        causes.append(("spec.activeDeadlineSeconds", "FieldValueInvalid", f"Invalid value: {deadline}: must be between 1 and 2147483647, inclusive"))
    return causes


def new_pod(namespace, body):
    """The stored Pod for a create request's body (metadata filled, defaults set, status
    Pending); a 400 or 422 as the apiserver answers for a malformed or invalid one."""
    if not isinstance(body, dict):
        raise bad_request("Pod in version \"v1\" cannot be handled as a Pod: body is not a JSON object")
    if body.get("kind") not in (None, "Pod"):
        raise bad_request(f"the body's kind is {body.get('kind')!r}, expected Pod")
    metadata = body.get("metadata") or {}
    if metadata.get("namespace") not in (None, namespace):
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
    name = metadata.get("name") or ""
    if not name and metadata.get("generateName"):
        name = metadata["generateName"] + secrets.token_hex(3)[:5]
    causes = _validate(name, body)
    if causes:
        raise invalid(name, causes)
    spec = dict(body["spec"])
    for i, container in enumerate(spec["containers"]):
        limits = (container.get("resources") or {}).get("limits") or {}
        for key in ("cpu", "memory"):
            if key in limits:
                parse_quantity(limits[key], f"spec.containers[{i}].resources.limits.{key}")
        container.setdefault("imagePullPolicy", "Always" if container["image"].endswith(":latest") else "IfNotPresent")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec["nodeName"] = NODE_NAME
    pod_metadata = {k: v for k, v in metadata.items() if k in ("labels", "annotations", "generateName", "ownerReferences")}
    pod_metadata.update(
        name=name,
        namespace=namespace,
        uid=str(uuid.uuid4()),
        creationTimestamp=now_rfc3339(),
    )
    container = spec["containers"][0]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": pod_metadata,
        "spec": spec,
        "status": {
            "phase": "Pending",
            "hostIP": "127.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}],
            "containerStatuses": [waiting_status(container, "ContainerCreating")],
            "qosClass": "BestEffort" if not container.get("resources") else "Burstable",
        },
    }


def waiting_status(container, reason, message=None):
    state = {"reason": reason}
    if message:
        state["message"] = message
    return {
        "name": container["name"],
        "state": {"waiting": state},
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "image": container["image"],
        "imageID": "",
        "started": False,
    }


def run_args(pod, instance):
    """`docker run -d` arguments for the pod's container: its labels, limits, command
    (`command` replaces the image's entrypoint, `args` its cmd, as on a kubelet), env and
    working directory; no network; an init process to reap children."""
    meta, container = pod["metadata"], pod["spec"]["containers"][0]
    args = ["run", "-d", "--init", "--network", "none"]
    args += ["--name", container_name(instance, meta["namespace"], meta["name"])]
    args += ["--label", f"swerve.k8s-standin.instance={instance}"]
    args += ["--label", f"swerve.k8s-standin.pod={meta['namespace']}/{meta['name']}"]
    for key, value in (meta.get("labels") or {}).items():
        args += ["--label", f"{key}={value}"]
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        args += ["--memory", str(int(parse_quantity(limits["memory"], "memory")))]
    if "cpu" in limits:
        args += ["--cpus", f"{parse_quantity(limits['cpu'], 'cpu'):.3f}"]
    for env in container.get("env") or []:
        if isinstance(env, dict) and "name" in env and "value" in env:
            args += ["-e", f"{env['name']}={env['value']}"]
    if container.get("workingDir"):
        args += ["-w", container["workingDir"]]
    command, cmd_args = container.get("command") or [], container.get("args") or []
    if command:
        args += ["--entrypoint", command[0], container["image"]] + command[1:] + cmd_args
    else:
        args += [container["image"]] + cmd_args
    return args


def container_name(instance, namespace, name):
    return f"k8s-standin-{instance}-{namespace}-{name}"
