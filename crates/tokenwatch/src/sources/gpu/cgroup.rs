// Container and pod attribution of a process from `/proc/<pid>/cgroup` (cgroup v1 and v2):
// Docker, containerd/CRI, CRI-O and Podman container ids, and Kubernetes pod UIDs.

use super::reader::ContainerRef;
use std::path::Path;

/// Largest cgroup file read; real ones are a few hundred bytes to a few KiB.
const MAX_CGROUP_FILE: u64 = 64 * 1024;

/// The container of process `pid`, read from `<proc_root>/<pid>/cgroup`; `None` for host
/// processes, processes that are gone, and unreadable files.
pub fn container_of(proc_root: &Path, pid: u32) -> Option<ContainerRef> {
    use std::io::Read;
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let mut text = String::new();
    file.take(MAX_CGROUP_FILE).read_to_string(&mut text).ok()?;
    parse_cgroup(&text)
}

/// Parse the contents of a `/proc/<pid>/cgroup` file. Each line is `id:controllers:path`
/// (`0::/path` on cgroup v2); the first line that names a container or pod wins.
pub fn parse_cgroup(text: &str) -> Option<ContainerRef> {
    let mut best: Option<ContainerRef> = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(_controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Some(found) = parse_path(path) else {
            continue;
        };
        if found.container_id.is_some() {
            return Some(found);
        }
        // A pod without a container id (e.g. the pod-level slice): keep looking for a better line.
        best.get_or_insert(found);
    }
    best
}

/// Look for a container id and a pod UID in one cgroup path.
fn parse_path(path: &str) -> Option<ContainerRef> {
    let mut out = ContainerRef::default();
    let mut previous = "";
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        if out.pod_uid.is_none() {
            // In the `slice:runtime:id` form the pod is in the slice part.
            out.pod_uid = pod_uid(segment.split(':').next().unwrap_or(segment));
        }
        if let Some((runtime, id)) = container_in_segment(segment, previous) {
            out.runtime = runtime.to_string();
            out.container_id = Some(id);
        }
        previous = segment;
    }
    if out.container_id.is_none() && out.pod_uid.is_none() {
        return None;
    }
    if out.runtime.is_empty() && out.container_id.is_some() && path.contains("containerd") {
        out.runtime = "containerd".into();
    }
    Some(out)
}

/// Systemd scope prefixes (`<prefix><64hex>.scope`) and the runtime each one means.
const SCOPE_PREFIXES: [(&str, &str); 5] = [
    ("docker-", "docker"),
    ("cri-containerd-", "containerd"),
    ("crio-", "cri-o"),
    ("libpod-", "podman"),
    ("containerd-", "containerd"),
];

/// Runtime names used in the `slice:runtime:id` form of the systemd cgroup driver.
const COLON_RUNTIMES: [(&str, &str); 3] = [
    ("cri-containerd", "containerd"),
    ("docker", "docker"),
    ("crio", "cri-o"),
];

fn container_in_segment(segment: &str, previous: &str) -> Option<(&'static str, String)> {
    // `kubepods-burstable-pod<uid>.slice:cri-containerd:<id>` (containerd with the systemd driver).
    let mut parts = segment.rsplitn(3, ':');
    if let (Some(id), Some(runtime), Some(_slice)) = (parts.next(), parts.next(), parts.next()) {
        let runtime = COLON_RUNTIMES
            .iter()
            .find(|(name, _)| *name == runtime)
            .map(|(_, r)| *r)?;
        return is_container_id(id).then(|| (runtime, id.to_ascii_lowercase()));
    }
    // `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope` (systemd driver).
    if let Some(stem) = segment.strip_suffix(".scope") {
        for (prefix, runtime) in SCOPE_PREFIXES {
            if let Some(id) = stem.strip_prefix(prefix).filter(|id| is_container_id(id)) {
                return Some((runtime, id.to_ascii_lowercase()));
            }
        }
        return None;
    }
    // A bare id: `/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`, `/containerd/<id>`.
    if is_container_id(segment) {
        let runtime = match previous {
            "docker" => "docker",
            "containerd" | "k8s.io" | "default" | "moby" => "containerd",
            "crio" => "cri-o",
            "libpod_parent" => "podman",
            _ => "",
        };
        return Some((runtime, segment.to_ascii_lowercase()));
    }
    None
}

/// A container id is 64 hex digits (Docker, containerd, CRI-O and Podman all use that form).
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `pod<uid>` (cgroupfs driver) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid(segment: &str) -> Option<String> {
    let raw = if let Some(rest) = segment.strip_prefix("pod") {
        rest
    } else if segment.starts_with("kubepods") {
        let stem = segment.strip_suffix(".slice")?;
        let at = stem.rfind("-pod")?;
        &stem[at + 4..]
    } else {
        return None;
    };
    let uid = raw.replace('_', "-").to_ascii_lowercase();
    is_uid(&uid).then_some(uid)
}

/// `8-4-4-4-12` hex groups, as Kubernetes pod UIDs are.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4b2c1d0e9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c";
    const UID: &str = "5c2e3b8a-1d4f-4e6a-9b7c-0a1b2c3d4e5f";

    fn parsed(text: &str) -> ContainerRef {
        parse_cgroup(text).unwrap_or_else(|| panic!("nothing found in {text:?}"))
    }

    /// Parse `text` and compare (runtime, container id, pod uid) with `want`.
    fn check(text: &str, want: (&str, Option<&str>, Option<&str>)) {
        let c = parsed(text);
        let got = (
            c.runtime.as_str(),
            c.container_id.as_deref(),
            c.pod_uid.as_deref(),
        );
        assert_eq!(got, want, "{text}");
    }

    #[test]
    fn docker_cgroup_v1_cgroupfs() {
        let text = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n4:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        let c = parsed(&text);
        assert_eq!(
            (c.runtime.as_str(), c.container_id.as_deref(), c.pod_uid),
            ("docker", Some(ID), None)
        );
    }

    #[test]
    fn docker_cgroup_v2_systemd() {
        let c = parsed(&format!("0::/system.slice/docker-{ID}.scope\n"));
        assert_eq!(
            (c.runtime.as_str(), c.container_id.as_deref()),
            ("docker", Some(ID))
        );
    }

    #[test]
    fn containerd_outside_kubernetes() {
        let c = parsed(&format!("0::/default/{ID}\n"));
        assert_eq!(
            (c.runtime.as_str(), c.container_id.as_deref()),
            ("containerd", Some(ID))
        );
        let c = parsed(&format!("5:memory:/containerd/{ID}\n"));
        assert_eq!(c.runtime, "containerd");
        let c = parsed(&format!("0::/system.slice/containerd-{ID}.scope\n"));
        assert_eq!(c.runtime, "containerd");
    }

    #[test]
    fn kubernetes_cgroup_v1_cgroupfs() {
        let text = format!(
            "11:memory:/kubepods/burstable/pod{UID}/{ID}\n10:devices:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        let c = parsed(&text);
        assert_eq!(c.container_id.as_deref(), Some(ID));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
        // Guaranteed QoS has no QoS level in the path.
        let c = parsed(&format!("3:cpuset:/kubepods/pod{UID}/{ID}\n"));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn kubernetes_cgroup_v1_systemd_with_docker() {
        let pod = UID.replace('-', "_");
        let text = format!(
            "9:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod}.slice/docker-{ID}.scope\n"
        );
        check(&text, ("docker", Some(ID), Some(UID)));
    }

    #[test]
    fn kubernetes_cgroup_v2_containerd_and_crio() {
        let pod = UID.replace('-', "_");
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/cri-containerd-{ID}.scope\n"
        );
        check(&text, ("containerd", Some(ID), Some(UID)));
        let text = format!("0::/kubepods.slice/kubepods-pod{pod}.slice/crio-{ID}.scope\n");
        check(&text, ("cri-o", Some(ID), Some(UID)));
    }

    #[test]
    fn containerd_systemd_driver_colon_form_and_nested_kind() {
        let pod = UID.replace('-', "_");
        let text = format!(
            "0::/system.slice/containerd.service/kubepods-burstable-pod{pod}.slice:cri-containerd:{ID}\n"
        );
        check(&text, ("containerd", Some(ID), Some(UID)));
    }

    #[test]
    fn pod_level_line_is_kept_when_no_container_line_exists() {
        let pod = UID.replace('-', "_");
        let c = parsed(&format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{pod}.slice\n"
        ));
        assert_eq!((c.container_id, c.pod_uid.as_deref()), (None, Some(UID)));
        // A later line with the container id is preferred.
        let text = format!(
            "2:cpu:/kubepods/besteffort/pod{UID}\n1:memory:/kubepods/besteffort/pod{UID}/{ID}\n"
        );
        assert_eq!(parsed(&text).container_id.as_deref(), Some(ID));
    }

    #[test]
    fn uppercase_ids_are_lowercased() {
        let c = parsed(&format!(
            "0::/system.slice/docker-{}.scope\n",
            ID.to_uppercase()
        ));
        assert_eq!(c.container_id.as_deref(), Some(ID));
    }

    #[test]
    fn host_processes_garbage_and_empty_give_nothing() {
        for text in [
            "",
            "\n\n",
            "0::/\n",
            "0::/init.scope\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            "12:pids:/system.slice/docker.service\n1:name=systemd:/system.slice/containerd.service\n",
            "garbage without colons\n",
            "0::/system.slice/docker-notahexid.scope\n",
            "0::/system.slice/crio-conmon-abc.scope\n",
            "0::/docker/0123\n",
            "0::/kubepods/burstable/podnot-a-uid/\n",
            "\u{0}\u{1}::::::\n",
        ] {
            assert_eq!(parse_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn reads_from_a_proc_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("77")).unwrap();
        std::fs::write(
            dir.path().join("77/cgroup"),
            format!("0::/system.slice/docker-{ID}.scope\n"),
        )
        .unwrap();
        assert_eq!(
            container_of(dir.path(), 77)
                .unwrap()
                .container_id
                .as_deref(),
            Some(ID)
        );
        assert_eq!(container_of(dir.path(), 78), None);
        std::fs::create_dir_all(dir.path().join("79")).unwrap();
        std::fs::write(dir.path().join("79/cgroup"), [0xff, 0xfe, b':', b':']).unwrap();
        assert_eq!(container_of(dir.path(), 79), None);
    }
}
