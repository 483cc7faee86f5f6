//! Worker processes (`modelshare probe --hold`) holding a lease.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};

use serde_json::Value;

use super::{BIN, Server};

/// A worker process holding a lease.
pub struct Worker {
    child: Child,
    lines: BufReader<ChildStdout>,
    /// The JSON report the worker printed after attaching.
    pub report: Value,
}

impl Worker {
    /// Starts `modelshare probe MODEL --hold --output json` and waits for its report.
    pub fn start(server: &Server, model: &str, name: &str) -> Worker {
        let mut child = Command::new(BIN)
            .args([
                "--server",
                &server.address,
                "--output",
                "json",
                "probe",
                model,
                "--hold",
                "--name",
                name,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn probe");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let report = read_json_line(&mut lines);
        assert_eq!(report["event"], "attached", "{report}");
        Worker {
            child,
            lines,
            report,
        }
    }

    /// Runs `modelshare probe MODEL --hold` with `env` (a token, say) and, when given, as
    /// `uid`. `Err` carries the probe's exit status and error output when it did not attach.
    pub fn try_start_as(
        address: &str,
        model: &str,
        name: &str,
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Result<Worker, String> {
        use std::io::Read;
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(BIN);
        cmd.args([
            "--server", address, "--output", "json", "probe", model, "--hold", "--name", name,
        ])
        .env_remove("MODELSHARE_TOKEN")
        .env_remove("MODELSHARE_TOKEN_FILE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("spawn probe");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        let n = lines.read_line(&mut line).expect("read");
        if n == 0 {
            let status = child.wait().expect("wait");
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("{status}: {err}"));
        }
        let report: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(report["event"], "attached", "{report}");
        Ok(Worker {
            child,
            lines,
            report,
        })
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn next_event(&mut self) -> Value {
        read_json_line(&mut self.lines)
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) {
        let _ = self.child.wait();
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(ok.success());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_json_line(lines: &mut BufReader<ChildStdout>) -> Value {
    let mut line = String::new();
    let n = lines
        .read_line(&mut line)
        .expect("read a line from the worker");
    assert!(n > 0, "the worker closed its output");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}
