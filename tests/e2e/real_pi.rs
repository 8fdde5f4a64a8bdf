//! The real pi (`@mariozechner/pi-coding-agent` 0.73.1, installed by `.ci/run`) under sortie,
//! against the project's mock model server (`tests/mock-llm/server.py`, on 127.0.0.1): nothing
//! contacts a model provider (pi runs with `--offline`, its only provider is the mock).
//!
//! One batch, four tasks at concurrency 4, so several pi processes run at once, each in its own
//! agent home seeded from a fake user's `~/.pi/agent` (whose settings turn pi's retries *on*,
//! so the test also shows that sortie turns them off):
//! - `plain`: a plain answer → completed, the text is the mock's answer;
//! - `tool`: a `bash` tool call (`echo hi > out.txt`), then an answer → completed, side effects
//!   recorded, `out.txt` in the task's cwd;
//! - `fallback`: `mock/bad` answers HTTP 500 every time → attempt 1 fails with `error` after a
//!   single request (pi's own retries are off), attempt 2 on the fallback `mock/good` completes;
//! - `stall`: `mock/hang` sends headers and then nothing → the stall watchdog marks attempt 1
//!   stalled and stops it (`stalled`, transient), attempt 2 on `mock/good` completes. The
//!   watchdog's times (15 s, then 10 s) leave room for pi's start-up, which is silent too: 1.5 s
//!   on an idle machine, over 15 s seen on a loaded one (then pi never reached the mock).
//!
//! The journal's usage (the `audit` ledger, per model and in total, and the attempts in
//! `export`) equals what the mock logged it served.
//!
//! Without pi 0.73.1 (or python3) the test is skipped, saying why, unless `CI` is set: then
//! it fails (`sortie_testkit::real_agent`). When it runs it leaves a cookie in
//! `target/real-agent-tests/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sortie_testkit::real_agent::{
    ANSWER, MockServer, PI_VARS, attempts, pi_found, pi_user, should_run,
};

use crate::support::{Scratch, event_kind, run_as_user, unique_run};
use sortie_testkit::Events;

/// The models the fake user's pi offers.
const MODELS: &[&str] = &["good", "tool", "bad", "hang"];

/// Token counts as the ledger keeps them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tokens {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
}

impl Tokens {
    fn of(v: &Value) -> Tokens {
        let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
        Tokens {
            input: n("input"),
            output: n("output"),
            cache_read: n("cache_read"),
            cache_write: n("cache_write"),
        }
    }

    fn add(&mut self, o: Tokens) {
        self.input += o.input;
        self.output += o.output;
        self.cache_read += o.cache_read;
        self.cache_write += o.cache_write;
    }

    /// The cost at the test's price ($3 / $15 / $0.30 / $3.75 per Mtok) in nano-dollars.
    fn nanos(self) -> u64 {
        self.input * 3_000 + self.output * 15_000 + self.cache_read * 300 + self.cache_write * 3_750
    }
}

/// Every file under `dir` (relative path → bytes, or `-> target` for a symlink).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = entry.path();
            let rel = p.strip_prefix(dir).expect("under dir").to_path_buf();
            let meta = std::fs::symlink_metadata(&p).expect("metadata");
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p).expect("read_link");
                out.insert(rel, format!("-> {}", target.display()));
            } else if meta.is_dir() {
                out.insert(rel, "<dir>".into());
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).expect("read");
                out.insert(rel, String::from_utf8_lossy(&bytes).into_owned());
            }
        }
    }
    out
}

/// The most attempts the journal shows live at once.
fn most_at_once(events: &[Value]) -> usize {
    let (mut live, mut most) = (0usize, 0usize);
    for e in events {
        match event_kind(e).0 {
            "AttemptStarted" => {
                live += 1;
                most = most.max(live);
            }
            "AttemptFinished" => live = live.saturating_sub(1),
            _ => {}
        }
    }
    most
}

#[test]
fn real_pi_answers_runs_tools_falls_back_and_is_caught_stalling_with_usage_as_served() {
    if !should_run("real_pi", pi_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::openai(
        s.path(),
        &[
            ("good", "answer"),
            ("tool", "tool"),
            ("bad", "error500"),
            ("hang", "hang"),
        ],
    );
    let home = s.path().join("home");
    let user_agent = pi_user(&home, mock.port, MODELS);
    let before = snapshot(&home);
    for dir in ["work/plain", "work/tool", "work/fallback", "work/stall"] {
        std::fs::create_dir_all(s.path().join(dir)).expect("mkdir");
    }
    let run = unique_run("real-pi");
    let batch = s.write(
        "batch.toml",
        "concurrency = 4\n\n\
         [defaults]\nagent = \"pi\"\nmax_retries = 1\nattempt_timeout = \"2m\"\n\n\
         [[tasks]]\nlabel = \"plain\"\ncwd = \"work/plain\"\nmodel = \"mock/good\"\n\
         prompt = \"Say hello.\"\n\n\
         [[tasks]]\nlabel = \"tool\"\ncwd = \"work/tool\"\nmodel = \"mock/tool\"\n\
         prompt = \"Write hi into out.txt.\"\n\n\
         [[tasks]]\nlabel = \"fallback\"\ncwd = \"work/fallback\"\nmodel = \"mock/bad\"\n\
         fallback_models = [\"mock/good\"]\nprompt = \"Say hello.\"\n\n\
         [[tasks]]\nlabel = \"stall\"\ncwd = \"work/stall\"\nmodel = \"mock/hang\"\n\
         fallback_models = [\"mock/good\"]\nstall_after = \"15s\"\nstall_kill_after = \"10s\"\n\
         prompt = \"Say hello.\"\n",
    );
    let started = std::time::Instant::now();
    let (out, stderr) = run_as_user(&s, &home, PI_VARS, &run, &batch);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "sortie run: {stderr}");

    let events = s.events(&run);
    // plain: one attempt, completed, the mock's answer.
    let plain = attempts(&events, 0);
    assert_eq!(plain.len(), 1, "{plain:?}");
    assert_eq!(
        (plain[0].status.as_str(), plain[0].stop_reason.as_str()),
        ("completed", "completed")
    );
    assert_eq!(plain[0].output, ANSWER);

    // tool: completed, the bash call's side effect seen and done in the task's cwd.
    let tool = attempts(&events, 1);
    assert_eq!(tool.len(), 1, "{tool:?}");
    assert_eq!(tool[0].status, "completed", "{tool:?}");
    assert_eq!(tool[0].output, ANSWER);
    let finished = events.of(1, "AttemptFinished");
    assert_eq!(finished[0]["outcome"]["side_effects"], true);
    assert_eq!(
        std::fs::read_to_string(s.path().join("work/tool/out.txt")).expect("out.txt"),
        "hi\n"
    );

    // fallback: attempt 1 on mock/bad failed with a provider error, attempt 2 on mock/good.
    let fb = attempts(&events, 2);
    assert_eq!(fb.len(), 2, "{fb:?}");
    assert_eq!(
        (
            fb[0].model.as_str(),
            fb[0].status.as_str(),
            fb[0].stop_reason.as_str()
        ),
        ("mock/bad", "failed", "error"),
        "{fb:?}"
    );
    assert!(fb[0].error.contains("500"), "{fb:?}");
    assert_eq!(
        (fb[1].model.as_str(), fb[1].status.as_str()),
        ("mock/good", "completed")
    );
    assert_eq!(fb[1].output, ANSWER);

    // stall: attempt 1 on mock/hang marked stalled, then stopped as stalled; attempt 2 done.
    let st = attempts(&events, 3);
    assert_eq!(st.len(), 2, "{st:?}");
    assert_eq!(
        (st[0].model.as_str(), st[0].stop_reason.as_str()),
        ("mock/hang", "stalled"),
        "{st:?}"
    );
    // Marked stalled at least once (twice when a loaded machine kept pi silent at start-up).
    assert!(
        events
            .of(3, "AttemptStalled")
            .iter()
            .any(|b| b["attempt"] == 1)
    );
    assert_eq!(
        (st[1].model.as_str(), st[1].status.as_str()),
        ("mock/good", "completed")
    );

    // pi's own retries were off: one request to the failing model, one to the hanging one.
    let served = mock.served();
    let requests = |model: &str| served.iter().filter(|r| r["model"] == model).count();
    assert_eq!(requests("bad"), 1, "pi retried on its own: {served:?}");
    assert_eq!(requests("hang"), 1, "{served:?}");
    assert_eq!(requests("tool"), 2, "{served:?}");
    assert_eq!(requests("good"), 3, "{served:?}");

    // Several pi processes ran at once, each in its own home under the run dir.
    assert!(
        most_at_once(&events) >= 3,
        "the attempts did not overlap: {}",
        most_at_once(&events)
    );
    let agents = s.state_dir().join("runs").join(&run).join("agents");
    let mut homes: Vec<String> = std::fs::read_dir(&agents)
        .expect("the run has agent homes")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    homes.sort();
    assert_eq!(homes, ["0.1", "1.1", "2.1", "2.2", "3.1", "3.2"]);
    for h in &homes {
        let dir = agents.join(h);
        let settings: Value = serde_json::from_slice(
            &std::fs::read(dir.join("settings.json")).expect("the home's settings.json"),
        )
        .expect("JSON settings");
        assert_eq!(settings["retry"]["enabled"], false, "{h}: {settings}");
        assert_eq!(settings["retry"]["provider"]["maxRetries"], 0, "{h}");
        assert_eq!(
            settings["quietStartup"], true,
            "{h}: the user's settings are kept"
        );
        let auth = dir.join("auth.json");
        assert!(
            std::fs::symlink_metadata(&auth)
                .expect("auth.json")
                .file_type()
                .is_symlink(),
            "{h}: credentials are linked, not copied"
        );
        assert_eq!(
            std::fs::read_link(&auth).expect("link"),
            user_agent.join("auth.json")
        );
        assert!(dir.join("models.json").is_file(), "{h}");
        assert!(
            !dir.join("sessions").exists(),
            "{h}: sessions are not seeded"
        );
    }
    // Nothing was written to the fake user's home (pi may touch its credentials file only).
    let mut after = snapshot(&home);
    let mut before = before;
    let auth_key = PathBuf::from(".pi/agent/auth.json");
    before.remove(&auth_key);
    let auth_after = after.remove(&auth_key).expect("auth.json is still there");
    assert!(serde_json::from_str::<Value>(&auth_after).is_ok());
    assert_eq!(before, after, "the user's pi dir changed");

    // The journal's usage is what the mock served: per model, in total, and per attempt.
    let mut served_by_model: BTreeMap<String, Tokens> = BTreeMap::new();
    let mut served_total = Tokens::default();
    for r in &served {
        let t = Tokens::of(&r["tokens"]);
        let model = format!("mock/{}", r["model"].as_str().expect("a model"));
        served_by_model.entry(model).or_default().add(t);
        served_total.add(t);
    }
    let audit = s.audit_clean(&run);
    let ledger = &audit["ledger"];
    assert_eq!(
        Tokens::of(&ledger["total"]),
        served_total,
        "audit: {ledger}"
    );
    for row in ledger["models"].as_array().expect("ledger models") {
        let model = row[0].as_str().expect("every attempt had a model");
        let served = served_by_model.get(model).copied().unwrap_or_default();
        assert_eq!(Tokens::of(&row[1]), served, "model {model}: {ledger}");
    }
    let mut exported = Tokens::default();
    let mut turns = 0;
    for e in &events {
        if let ("AttemptFinished", b) = event_kind(e) {
            exported.add(Tokens::of(&b["usage"]));
            turns += b["usage"]["turns"].as_u64().expect("turns");
        }
    }
    assert_eq!(exported, served_total, "export");
    // One turn per assistant message: 1 (plain) + 2 (tool) + 1 + 1 (fallback) + 1 (stall).
    assert_eq!(turns, 6);
    // Cost: pi prices what it read at the models.json price; the ledger keeps nano-dollars.
    let cost = ledger["total"]["cost"]["nanos"].as_u64().expect("nanos");
    let want = served_total.nanos();
    assert!(
        cost.abs_diff(want) <= 6,
        "cost {cost} nanos, served tokens at the price make {want}"
    );
    // The attempt stopped while its request hung never heard what that request cost: unknown,
    // which the ledger says (one unreported part), rather than a made-up zero.
    assert_eq!(ledger["total"]["cost"]["unreported"], 1, "{ledger}");
    for row in ledger["models"].as_array().expect("ledger models") {
        let unreported = u64::from(row[0] == "mock/hang");
        assert_eq!(row[1]["cost"]["unreported"], unreported, "{ledger}");
    }
    println!(
        "served {served_total:?} ({} responses); journaled {:?}, cost {cost} nanos; took {took:?}",
        served.len(),
        Tokens::of(&ledger["total"])
    );
}

/// Permissions reach pi as its `--tools`: under `read-only` pi has no `bash`, so the mock's
/// `echo hi > out.txt` is a denied call (journaled, the attempt `partial`) and nothing is
/// written; under `edit` it writes `out.txt`; and a 1 MiB prompt reaches pi on stdin and the
/// model whole.
#[test]
fn real_pi_read_only_cannot_write_edit_can_and_a_1_mib_prompt_arrives() {
    if !should_run("real_pi_permissions", pi_found()) {
        return;
    }
    let s = Scratch::new();
    let mock = MockServer::openai(s.path(), &[("good", "answer"), ("tool", "tool")]);
    let home = s.path().join("home");
    pi_user(&home, mock.port, MODELS);
    for dir in ["work/ro", "work/edit", "work/big"] {
        std::fs::create_dir_all(s.path().join(dir)).expect("mkdir");
    }
    let mib = 1 << 20;
    let big = format!("Say hello. {}", "x".repeat(mib - "Say hello. ".len()));
    let run = unique_run("real-pi-perm");
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 3\n\n\
             [defaults]\nagent = \"pi\"\nmax_retries = 0\nattempt_timeout = \"2m\"\n\n\
             [[tasks]]\nlabel = \"ro\"\ncwd = \"work/ro\"\nmodel = \"mock/tool\"\n\
             permissions = \"read-only\"\nprompt = \"Write hi into out.txt.\"\n\n\
             [[tasks]]\nlabel = \"edit\"\ncwd = \"work/edit\"\nmodel = \"mock/tool\"\n\
             permissions = \"edit\"\nprompt = \"Write hi into out.txt.\"\n\n\
             [[tasks]]\nlabel = \"big\"\ncwd = \"work/big\"\nmodel = \"mock/good\"\n\
             prompt = \"{big}\"\n"
        ),
    );
    let (out, stderr) = run_as_user(&s, &home, PI_VARS, &run, &batch);
    assert_eq!(out.status.code(), Some(1), "a partial task: {stderr}");
    let events = s.events(&run);

    let ro = attempts(&events, 0);
    assert_eq!(ro.len(), 1, "{ro:?}");
    assert_eq!(
        (ro[0].status.as_str(), ro[0].stop_reason.as_str()),
        ("partial", "completed"),
        "{ro:?}"
    );
    let finished = events.of(0, "AttemptFinished");
    assert_eq!(
        finished[0]["outcome"]["denials"],
        serde_json::json!([{"tool": "bash", "count": 1}])
    );
    assert!(
        !s.path().join("work/ro/out.txt").exists(),
        "read-only wrote a file"
    );

    let edit = attempts(&events, 1);
    assert_eq!(edit[0].status, "completed", "{edit:?}");
    assert_eq!(
        std::fs::read_to_string(s.path().join("work/edit/out.txt")).expect("out.txt"),
        "hi\n"
    );

    let big = attempts(&events, 2);
    assert_eq!(
        (big.len(), big[0].status.as_str()),
        (1, "completed"),
        "{big:?}"
    );
    assert_eq!(big[0].output, ANSWER);
    let served = mock.served();
    let longest = served
        .iter()
        .filter_map(|r| r["prompt_chars"].as_u64())
        .max();
    assert_eq!(
        longest,
        Some(mib as u64),
        "the prompt arrived whole: {served:?}"
    );
}
