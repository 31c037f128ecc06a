// The Debian package (scripts/build-deb.sh with packaging/debian/), built from the binary under
// test: its fields and files, then installed with dpkg on this machine — the system user, the
// private data directory, the configuration only the service reads, a unit systemd accepts —,
// run as that user from its packaged configuration (listeners on port 0), asked /readyz and a
// proxied request, and purged. Needs root or passwordless sudo, as scripts/test.sh's installs.

use crate::common::{self, BIN, Proc};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const PACKAGE: &str = "tokenwatch";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `program` run as root: directly when the tests are root, else through `sudo -n`.
fn as_root(program: &str) -> Command {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .expect("running id -u");
    if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", program]);
        c
    }
}

fn run(mut cmd: Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Purges the package when the test ends, passed or not, so the machine is left as found
/// (the `tokenwatch` system user stays, as Debian policy keeps users a package made).
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = as_root("dpkg").args(["--purge", PACKAGE]).output();
    }
}

/// The installed user's uid and gid, from `getent passwd`: (uid, gid, home, shell).
fn system_user() -> (u32, u32, String, String) {
    let out = run({
        let mut c = Command::new("getent");
        c.args(["passwd", PACKAGE]);
        c
    });
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let f: Vec<&str> = line.split(':').collect();
    assert_eq!(f.len(), 7, "{line}");
    (
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
        f[5].to_string(),
        f[6].to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debian_package_installs_runs_as_its_user_proxies_and_purges() {
    let dir = tempfile::tempdir().unwrap();

    // Built from the test binary, uncompressed (xz over a debug binary takes ~45 s).
    let out = run({
        let mut c = Command::new(repo().join("scripts/build-deb.sh"));
        c.args([BIN, dir.path().to_str().unwrap()])
            .env("DEB_COMPRESS", "none");
        c
    });
    let deb = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(deb.is_file(), "no package at {}", deb.display());
    let field = |name: &str| {
        let out = run({
            let mut c = Command::new("dpkg-deb");
            c.args(["--field", deb.to_str().unwrap(), name]);
            c
        });
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(field("Package"), PACKAGE);
    assert_eq!(field("Version"), env!("CARGO_PKG_VERSION"));
    let depends = field("Depends");
    assert!(
        depends.contains("libc6 (>=") && depends.contains("passwd"),
        "{depends}"
    );
    let contents = run({
        let mut c = Command::new("dpkg-deb");
        c.args(["--contents", deb.to_str().unwrap()]);
        c
    });
    let contents = String::from_utf8_lossy(&contents.stdout);
    for path in [
        "./usr/bin/tokenwatch",
        "./lib/systemd/system/tokenwatch.service",
        "./etc/tokenwatch/tokenwatch.yaml",
        "./usr/share/doc/tokenwatch/copyright",
        "./usr/share/doc/tokenwatch/NOTICE",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(path)),
            "{path} not in the package:\n{contents}"
        );
    }

    // Installed: the user, its private data directory, the configuration it alone reads.
    let guard = Installed;
    run({
        let mut c = as_root("dpkg");
        c.args(["--install", deb.to_str().unwrap()]);
        c
    });
    let (uid, gid, home, shell) = system_user();
    assert_eq!(
        (home.as_str(), shell.as_str()),
        ("/var/lib/tokenwatch", "/usr/sbin/nologin")
    );
    let data = std::fs::metadata("/var/lib/tokenwatch").unwrap();
    assert_eq!(
        (data.uid(), data.gid(), data.permissions().mode() & 0o777),
        (uid, gid, 0o700)
    );
    let config = std::fs::metadata("/etc/tokenwatch/tokenwatch.yaml").unwrap();
    assert_eq!(
        (
            config.uid(),
            config.gid(),
            config.permissions().mode() & 0o777
        ),
        (0, gid, 0o640)
    );
    // systemd accepts the unit as installed (its binary and user exist now).
    run({
        let mut c = Command::new("systemd-analyze");
        c.args([
            "verify",
            "--man=no",
            "/lib/systemd/system/tokenwatch.service",
        ]);
        c
    });
    let version = run({
        let mut c = Command::new("/usr/bin/tokenwatch");
        c.arg("--version");
        c
    });
    assert!(
        String::from_utf8_lossy(&version.stdout)
            .starts_with(&format!("tokenwatch {}", env!("CARGO_PKG_VERSION")))
    );

    // Run as the service runs it (its user, its configuration), in front of a simulator, with
    // every listener on a port it picks.
    let (_sim, sim) = common::start_sim(dir.path(), &["--model", "m1"]).await;
    let upstream = format!("http://{sim}");
    let mut cmd = as_root("setpriv");
    cmd.args([
        "--reuid=tokenwatch",
        "--regid=tokenwatch",
        "--init-groups",
        "--",
        "/usr/bin/tokenwatch",
        "run",
        "--config",
        "/etc/tokenwatch/tokenwatch.yaml",
        "--listen",
        "127.0.0.1:0",
        "--proxy-listen",
        "127.0.0.1:0",
        "--otlp-grpc-listen",
        "127.0.0.1:0",
        "--otlp-http-listen",
        "127.0.0.1:0",
        "--upstream",
        &upstream,
    ]);
    let tw = Proc::start_command("installed", cmd, dir.path());
    let bound = tw.listening().await;
    let (api, proxy) = (bound["api"], bound["proxy"]);
    common::wait_ready(&format!("http://{api}/readyz"), &tw).await;
    let answer = common::chat_answer(
        proxy,
        &serde_json::json!({
            "model": "m1",
            "messages": [{"role": "user", "content": "hello from the package"}],
            "stream": true,
            "max_tokens": 5
        }),
        &[],
    )
    .await;
    assert!(!answer.is_empty());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = common::get(&format!("http://{api}/api/v1/requests?limit=5")).await;
        if r.status == 200 && r.body.contains("\"m1\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no stored request after 20 s: {}\n{}",
            r.body,
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What it wrote is the service user's, in its data directory only.
    let written: Vec<_> = std::fs::read_dir("/var/lib/tokenwatch")
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap())
        .collect();
    assert!(!written.is_empty(), "nothing in /var/lib/tokenwatch");
    assert!(
        written.iter().all(|m| m.uid() == uid),
        "a file in /var/lib/tokenwatch is not the tokenwatch user's"
    );
    drop(tw);

    // Purged: the binary, the unit and the data go.
    drop(guard);
    for gone in [
        "/usr/bin/tokenwatch",
        "/lib/systemd/system/tokenwatch.service",
        "/var/lib/tokenwatch",
        "/etc/tokenwatch/tokenwatch.yaml",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left after the purge");
    }
}
