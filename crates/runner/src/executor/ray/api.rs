//! Ray's job API over HTTP, as data and calls: submit (`POST /api/jobs/`), one job
//! (`GET /api/jobs/{id}`), every job (`GET /api/jobs/`), stop (`POST /api/jobs/{id}/stop`) and
//! the version (`GET /api/version`). Each call is a blocking `ureq` request on tokio's blocking
//! pool, bounded by a timeout. Every answer is external input: a body that does not parse is
//! an error that says what was expected, never a panic.

use std::time::Duration;

use serde_json::Value;
use sortie_core::RayOptions;
use sortie_protocol::Exit;

/// The bound on one call (a head node that does not answer is an error, not a hang).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A Ray job's status (`JobStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobState {
    Pending,
    Running,
    Stopped,
    Succeeded,
    Failed,
}

impl JobState {
    fn parse(s: &str) -> Option<JobState> {
        Some(match s {
            "PENDING" => JobState::Pending,
            "RUNNING" => JobState::Running,
            "STOPPED" => JobState::Stopped,
            "SUCCEEDED" => JobState::Succeeded,
            "FAILED" => JobState::Failed,
            _ => return None,
        })
    }

    /// True once the job ended.
    pub(crate) fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Stopped | JobState::Succeeded | JobState::Failed
        )
    }
}

/// What Ray says of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JobInfo {
    /// Its submission id.
    pub(crate) id: String,
    pub(crate) state: JobState,
    /// The entrypoint's exit code, when Ray knows it (negative: the signal that ended it).
    pub(crate) exit_code: Option<i64>,
    /// Ray's message (why it failed), first line.
    pub(crate) message: String,
    /// When it started and ended, in ms since the epoch (0: not yet).
    pub(crate) start_ms: u64,
    pub(crate) end_ms: u64,
}

impl JobInfo {
    /// The exit of an ended job, as the protocol reader takes it: Ray's exit code, else (a
    /// stop, a job whose entrypoint never ran) SIGTERM or 1.
    pub(crate) fn exit(&self) -> Exit {
        match (self.state, self.exit_code) {
            (JobState::Succeeded, _) => Exit::Code(0),
            (_, Some(c)) if c < 0 => Exit::Signal(i32::try_from(-c).unwrap_or(libc::SIGKILL)),
            (_, Some(c)) => Exit::Code(i32::try_from(c).unwrap_or(1)),
            (JobState::Stopped, None) => Exit::Signal(libc::SIGTERM),
            (_, None) => Exit::Code(1),
        }
    }
}

/// One job of an answer (an object of `GET /api/jobs/`'s list, or `GET /api/jobs/{id}`).
pub(crate) fn parse_job(v: &Value) -> Result<JobInfo, String> {
    let str_of = |k: &str| v.get(k).and_then(Value::as_str);
    let id = str_of("submission_id")
        .ok_or("a job without a submission_id")?
        .to_owned();
    let status = str_of("status").ok_or("a job without a status")?;
    let state =
        JobState::parse(status).ok_or_else(|| format!("an unknown job status {status:?}"))?;
    let message = str_of("message")
        .and_then(|m| m.lines().next())
        .unwrap_or("")
        .to_owned();
    let ms = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    Ok(JobInfo {
        id,
        state,
        exit_code: v.get("driver_exit_code").and_then(Value::as_i64),
        message,
        start_ms: ms("start_time"),
        end_ms: ms("end_time"),
    })
}

/// `GET /api/jobs/`'s answer: every job the head knows (ours are those with our ids; jobs
/// without a submission id, a driver's own, are left out).
pub(crate) fn parse_list(body: &str) -> Result<Vec<JobInfo>, String> {
    let v: Value = serde_json::from_str(body)
        .map_err(|e| format!("the job list is not JSON ({e}): {}", head(body)))?;
    let Value::Array(jobs) = v else {
        return Err(format!("the job list is not a JSON array: {}", head(body)));
    };
    jobs.iter()
        .filter(|j| j.get("submission_id").is_some_and(Value::is_string))
        .map(parse_job)
        .collect()
}

/// The start of a body, for an error.
fn head(body: &str) -> String {
    body.chars().take(200).collect()
}

/// The body of a submission: the entrypoint, its id, its resources and its variables.
pub(crate) fn submit_body(id: &str, entrypoint: &str, o: &RayOptions) -> Value {
    let mut body = serde_json::json!({
        "entrypoint": entrypoint,
        "submission_id": id,
        "metadata": { "sortie": "attempt" },
    });
    let env: serde_json::Map<String, Value> = o
        .runtime_env
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    body["runtime_env"] = serde_json::json!({ "env_vars": env });
    if let Some(c) = o.num_cpus {
        body["entrypoint_num_cpus"] = c.as_f64().into();
    }
    if let Some(g) = o.num_gpus {
        body["entrypoint_num_gpus"] = g.as_f64().into();
    }
    if let Some(m) = o.memory {
        body["entrypoint_memory"] = m.into();
    }
    let resources = o.all_resources();
    if !resources.is_empty() {
        let r: serde_json::Map<String, Value> = resources
            .into_iter()
            .map(|(k, v)| (k, v.as_f64().into()))
            .collect();
        body["entrypoint_resources"] = Value::Object(r);
    }
    body
}

/// What a submission did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// Ray took it.
    New,
    /// Ray refused it: a job with its id exists (a submission before a crash): adopted.
    Exists,
}

/// One head node's job API.
#[derive(Debug, Clone)]
pub(crate) struct Api {
    /// `http://host:port`, without a trailing `/`.
    pub(crate) address: String,
    agent: ureq::Agent,
}

/// An answer: its status code and body.
type Answer = (u16, String);

impl Api {
    pub(crate) fn new(address: &str) -> Api {
        Api {
            address: address.trim_end_matches('/').to_owned(),
            agent: ureq::AgentBuilder::new().timeout(CALL_TIMEOUT).build(),
        }
    }

    /// One call; an answer of any status, or why none came (naming the head).
    async fn call(
        &self,
        method: &'static str,
        path: String,
        body: Option<Value>,
    ) -> Result<Answer, String> {
        let agent = self.agent.clone();
        let url = format!("{}{path}", self.address);
        let address = self.address.clone();
        let run = move || {
            let req = agent.request(method, &url);
            let res = match &body {
                Some(b) => req
                    .set("Content-Type", "application/json")
                    .send_string(&b.to_string()),
                None => req.call(),
            };
            match res {
                Ok(r) => Ok((r.status(), r.into_string().unwrap_or_default())),
                Err(ureq::Error::Status(code, r)) => {
                    Ok((code, r.into_string().unwrap_or_default()))
                }
                Err(e) => Err(format!("the Ray head at {address} does not answer: {e}")),
            }
        };
        tokio::task::spawn_blocking(run)
            .await
            .map_err(|e| format!("a call to the Ray head failed: {e}"))?
    }

    /// Submits a job.
    pub(crate) async fn submit(&self, body: Value) -> Result<Submitted, String> {
        let (code, text) = self.call("POST", "/api/jobs/".into(), Some(body)).await?;
        match code {
            200..=299 => Ok(Submitted::New),
            // Ray refuses a second submission of an id with an error naming it.
            _ if text.contains("already exists") => Ok(Submitted::Exists),
            _ => Err(format!(
                "Ray refused the job (HTTP {code}): {}",
                last_line(&text)
            )),
        }
    }

    /// One job; None when Ray knows no job of that id.
    pub(crate) async fn job(&self, id: &str) -> Result<Option<JobInfo>, String> {
        let (code, text) = self.call("GET", format!("/api/jobs/{id}"), None).await?;
        match code {
            404 => Ok(None),
            200..=299 => {
                let v: Value = serde_json::from_str(&text).map_err(|e| {
                    format!(
                        "Ray's answer for job {id} is not JSON ({e}): {}",
                        head(&text)
                    )
                })?;
                parse_job(&v).map(Some)
            }
            _ => Err(format!(
                "Ray answered HTTP {code} for job {id}: {}",
                last_line(&text)
            )),
        }
    }

    /// Every job the head knows.
    pub(crate) async fn list(&self) -> Result<Vec<JobInfo>, String> {
        let (code, text) = self.call("GET", "/api/jobs/".into(), None).await?;
        match code {
            200..=299 => parse_list(&text),
            _ => Err(format!(
                "Ray answered HTTP {code} for the job list: {}",
                last_line(&text)
            )),
        }
    }

    /// Asks Ray to stop a job (TERM, then KILL after Ray's own wait); true when Ray says it
    /// stopped a running job.
    pub(crate) async fn stop(&self, id: &str) -> Result<bool, String> {
        let (code, text) = self
            .call("POST", format!("/api/jobs/{id}/stop"), None)
            .await?;
        match code {
            200..=299 => {
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                Ok(v.get("stopped").and_then(Value::as_bool).unwrap_or(false))
            }
            _ => Err(format!(
                "Ray answered HTTP {code} to stop job {id}: {}",
                last_line(&text)
            )),
        }
    }

    /// The cluster's Ray version.
    pub(crate) async fn version(&self) -> Result<String, String> {
        let (code, text) = self.call("GET", "/api/version".into(), None).await?;
        if !(200..=299).contains(&code) {
            return Err(format!(
                "the Ray head at {} answered HTTP {code}",
                self.address
            ));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "the Ray head at {} answered no JSON version ({e})",
                self.address
            )
        })?;
        v.get("ray_version")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("the Ray head at {} gave no ray_version", self.address))
    }

    /// What the cluster has: its live nodes and, per resource, the amount in use and the
    /// total (`GET /api/cluster_status`), as `1 node, CPU 0.1/4, memory 0.0/16.0 GiB`.
    pub(crate) async fn resources(&self) -> Result<String, String> {
        let (code, text) = self.call("GET", "/api/cluster_status".into(), None).await?;
        if !(200..=299).contains(&code) {
            return Err(format!(
                "the Ray head at {} answered HTTP {code} to its cluster status",
                self.address
            ));
        }
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "the Ray head at {} answered no JSON cluster status ({e})",
                self.address
            )
        })?;
        Ok(resources_line(&v))
    }
}

/// `1 node, CPU 0.1/4, GPU 0/1, memory 0.0/16.0 GiB` from a cluster status (the fields it
/// lacks left out; custom resources after the usual ones).
fn resources_line(v: &Value) -> String {
    let status = &v["data"]["clusterStatus"];
    let nodes = status["autoscalerReport"]["activeNodes"]
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum::<u64>());
    let mut parts = Vec::new();
    if let Some(n) = nodes {
        parts.push(format!("{n} node{}", if n == 1 { "" } else { "s" }));
    }
    let usage = status["loadMetricsReport"]["usage"].as_object();
    let pair = |name: &str| -> Option<(f64, f64)> {
        let a = usage?.get(name)?.as_array()?;
        Some((a.first()?.as_f64()?, a.get(1)?.as_f64()?))
    };
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    for name in ["CPU", "GPU"] {
        if let Some((used, total)) = pair(name) {
            parts.push(format!("{name} {}/{}", trim(used), trim(total)));
        }
    }
    if let Some((used, total)) = pair("memory") {
        parts.push(format!("memory {:.1}/{:.1} GiB", used / GIB, total / GIB));
    }
    if let Some(usage) = usage {
        for (name, a) in usage {
            let known = [
                "CPU",
                "GPU",
                "memory",
                "objectStoreMemory",
                "object_store_memory",
            ];
            if known.contains(&name.as_str()) || name.starts_with("node:") {
                continue;
            }
            if let (Some(used), Some(total)) = (a[0].as_f64(), a[1].as_f64()) {
                parts.push(format!("{name} {}/{}", trim(used), trim(total)));
            }
        }
    }
    if parts.is_empty() {
        "resources unknown".to_owned()
    } else {
        parts.join(", ")
    }
}

/// A resource amount without float noise: `4`, `0.1`, `2.5`.
fn trim(x: f64) -> String {
    let s = format!("{:.2}", x);
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The last non-empty line of an error body (Ray's tracebacks end with the reason).
fn last_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && *l != ".")
        .unwrap_or("no details");
    line.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_parse_from_recorded_answers() {
        let list = r#"[{"type": "SUBMISSION", "job_id": null, "submission_id": "sortie-r-0-1-a",
            "status": "FAILED", "message": "Job entrypoint command failed with exit code 7, last\nx",
            "start_time": 1796494467432, "end_time": 1796494468965, "driver_exit_code": 7},
            {"type": "DRIVER", "job_id": "01000000", "submission_id": null, "status": "RUNNING"}]"#;
        let jobs = parse_list(list).expect("a list");
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].state, JobState::Failed);
        assert_eq!(jobs[0].exit(), Exit::Code(7));
        assert!(jobs[0].message.ends_with("exit code 7, last"));
        assert!(parse_list("<html>").unwrap_err().contains("not JSON"));
        assert!(parse_list("{}").unwrap_err().contains("not a JSON array"));
        let bad = r#"[{"submission_id": "x", "status": "EXPLODED"}]"#;
        assert!(parse_list(bad).unwrap_err().contains("EXPLODED"));
    }

    #[test]
    fn ends_read_as_exits() {
        let job = |state, exit_code| JobInfo {
            id: "x".into(),
            state,
            exit_code,
            message: String::new(),
            start_ms: 0,
            end_ms: 0,
        };
        assert_eq!(job(JobState::Succeeded, None).exit(), Exit::Code(0));
        assert_eq!(job(JobState::Failed, Some(-9)).exit(), Exit::Signal(9));
        assert_eq!(
            job(JobState::Stopped, None).exit(),
            Exit::Signal(libc::SIGTERM)
        );
        assert_eq!(job(JobState::Failed, None).exit(), Exit::Code(1));
    }

    #[test]
    fn a_submission_carries_resources_and_variables() {
        let o = RayOptions {
            num_cpus: Some(sortie_core::Milli(500)),
            resources: vec![("tpu".into(), sortie_core::Milli(1000))],
            runtime_env: vec![("A".into(), "b".into())],
            ..RayOptions::default()
        };
        let b = submit_body("id", "sh job.sh", &o);
        assert_eq!(b["entrypoint_num_cpus"], 0.5);
        assert_eq!(b["entrypoint_resources"]["tpu"], 1.0);
        assert_eq!(b["runtime_env"]["env_vars"]["A"], "b");
        assert_eq!(
            last_line("Traceback\nValueError: no\n.\n"),
            "ValueError: no"
        );
    }

    #[test]
    fn a_cluster_status_reads_as_nodes_and_resources() {
        let v: Value = serde_json::json!({"data": {"clusterStatus": {
            "autoscalerReport": {"activeNodes": {"nodeA": 1, "nodeB": 1}},
            "loadMetricsReport": {"usage": {
                "CPU": [0.1, 4.0], "GPU": [1.0, 2.0],
                "memory": [0.0, 17179869184.0], "object_store_memory": [0.0, 1.0],
                "node:192.0.2.2": [0.0, 1.0], "TPU": [0.0, 8.0]
            }}
        }}});
        assert_eq!(
            resources_line(&v),
            "2 nodes, CPU 0.1/4, GPU 1/2, memory 0.0/16.0 GiB, TPU 0/8"
        );
        assert_eq!(resources_line(&Value::Null), "resources unknown");
    }
}
