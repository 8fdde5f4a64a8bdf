//! End-to-end tests (#37): `max_cost` binds an agent that reports tokens but no cost (Codex).
//! sortie prices its tokens from the built-in table or the batch's `[prices]`, journals that
//! cost, stops the task on its budget, and marks the cost as priced; `check` and `run` refuse a
//! cost budget over a model it cannot price. The agent is `examples/agents/fake-stream.py`
//! replaying Codex's recorded `codex_ok` stream (100 input, 50 cached, 12 output tokens).

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::support::{Background, Scratch, task_view, unique_run};
use sortie_testkit::Events;

/// A `codex-json` profile running the fake stream agent on Codex's `codex_ok` sample, with
/// `args` added.
fn codex_profile(name: &str, args: &[&str]) -> String {
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents/fake-stream.py");
    let mut argv = vec![
        "python3".to_owned(),
        fake.display().to_string(),
        "--sample".to_owned(),
        "codex_ok".to_owned(),
    ];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv.extend(["{model_args}".to_owned(), "{prompt}".to_owned()]);
    let quoted: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[agents.{name}]\ncommand = [{}]\nmodel_args = [\"--model\", \"{{model}}\"]\n\
         protocol = \"codex-json\"\nmay_write = false\n\n",
        quoted.join(", ")
    )
}

/// `sortie ARGS` with a Codex key set (admission asks for one; the fake never uses it).
fn sortie(s: &Scratch, args: &[&str]) -> Command {
    let mut c = s.sortie();
    c.env("OPENAI_API_KEY", "sk-fake-for-tests")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run(s: &Scratch, run: &str, batch: &str) -> Output {
    let file = s.write("batch.toml", batch);
    let cmd = sortie(s, &["run", "--run-id", run, file.to_str().expect("utf-8")]);
    Background::from_command(cmd, run).finish(120)
}

/// What a command printed (`check` lists its problems on stdout), both streams.
fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The cost (nanos, unreported) of the last usage the journal holds for task `task`.
fn journaled_cost(events: &[Value], task: u64) -> (u64, u64) {
    let f = events.of(task, "AttemptFinished");
    let cost = &f.last().expect("an attempt finished")["usage"]["cost"];
    (
        cost["nanos"].as_u64().expect("nanos"),
        cost["unreported"].as_u64().expect("unreported"),
    )
}

#[test]
fn prices_max_cost_stops_a_codex_task_priced_from_the_table_and_the_batch() {
    let s = Scratch::new();
    let id = unique_run("prices-bind");
    // `capped` keeps running after its usage line (`--hold`): only its budget can stop it
    // (its stall limits end it otherwise, as a stall, not a budget).
    let batch = format!(
        "{}{}[[tasks]]\nlabel = \"capped\"\nagent = \"holding\"\nmodel = \"gpt-5-codex\"\n\
         prompt = \"say hello\"\nmax_cost = 0.0001\nstall_after = \"10s\"\n\
         stall_kill_after = \"1s\"\n\n\
         [[tasks]]\nlabel = \"own-price\"\nagent = \"done\"\nmodel = \"mock-model\"\n\
         prompt = \"say hello\"\n\n\
         [prices.\"mock-model\"]\ninput = 2.0\noutput = 8\ncache_read = 0.5\n",
        codex_profile("holding", &["--hold"]),
        codex_profile("done", &[]),
    );
    let out = run(&s, &id, &batch);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "partial: {stdout}\n{stderr}");
    let events = s.events(&id);
    let r = &events.of(0, "TaskFinished")[0]["result"];
    assert_eq!(r["state"], "partial", "{r}");
    assert_eq!(r["stop_reason"], "budget", "{r}");
    let error = r["error"].as_str().expect("an error");
    assert!(
        error.contains("exceeded max cost budget ($0.0003 of $0.0001)"),
        "{error}"
    );
    // gpt-5-codex at $1.25 in, $10 out, $0.125 cached: 100 × 1.25 + 12 × 10 + 50 × 0.125
    // micro-dollars, priced, nothing unreported; the batch's price for mock-model ($2, $8,
    // $0.50): 200 + 96 + 25.
    assert_eq!(journaled_cost(&events, 0), (251_250, 0));
    assert_eq!(journaled_cost(&events, 1), (321_000, 0));
    assert_eq!(
        events.of(1, "TaskFinished")[0]["result"]["state"],
        "completed"
    );
    // The summary marks both costs priced and says from what.
    assert!(stdout.contains("$0.0003*"), "{stdout}");
    assert!(
        stdout.contains("cost priced by sortie for 2 task(s)")
            && stdout.contains(&format!(
                "list prices as of {}",
                sortie_core::prices::PRICES_AS_OF
            )),
        "{stdout}"
    );
    let status = s.status(&id);
    assert_eq!(task_view(&status, "capped")["cost_priced"], true);
    assert!(
        status["cost_priced"]
            .as_str()
            .is_some_and(|n| n.contains("priced by sortie")),
        "{status}"
    );
    // The journal keeps the prices: audit's ledger (a replay) finds the same total.
    let audit = s.audit_clean(&id);
    assert_eq!(
        audit["ledger"]["total"]["cost"]["nanos"], 572_250,
        "{audit}"
    );
    assert_eq!(
        events[0]["event"]["RunStarted"]["batch"]["config"]["prices"]["models"]["gpt-5-codex"]["input"],
        1_250_000_000u64
    );
}

#[test]
fn prices_the_runs_max_cost_stops_a_codex_run() {
    let s = Scratch::new();
    let id = unique_run("prices-run-budget");
    let batch = format!(
        "{}[budget]\nmax_cost = 0.0001\n\n[[tasks]]\nlabel = \"first\"\nagent = \"done\"\n\
         model = \"gpt-5-codex\"\nprompt = \"say hello\"\n\n\
         [[tasks]]\nlabel = \"second\"\nagent = \"done\"\nmodel = \"gpt-5-codex\"\n\
         prompt = \"say hello\"\nneeds = [\"first\"]\n",
        codex_profile("done", &[]),
    );
    let out = run(&s, &id, &batch);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let events = s.events(&id);
    let exceeded = events
        .iter()
        .find_map(|e| e["event"].get("RunBudgetExceeded"));
    let exceeded = exceeded.unwrap_or_else(|| panic!("the run's budget ran out: {stderr}"));
    assert_eq!(exceeded["limit"], "cost", "{exceeded}");
    assert_eq!(
        events.of(1, "TaskFinished")[0]["result"]["state"],
        "cancelled",
        "the second task never starts"
    );
    assert_eq!(events.of(1, "AttemptLaunching").len(), 0);
}

#[test]
fn prices_check_and_run_refuse_a_cost_budget_over_a_model_without_a_price() {
    let s = Scratch::new();
    let batch = format!(
        "{}[[tasks]]\nlabel = \"mystery-task\"\nagent = \"done\"\nmodel = \"mystery\"\n\
         prompt = \"say hello\"\nmax_cost = 1\n\n\
         [[tasks]]\nlabel = \"default-model\"\nagent = \"done\"\nprompt = \"say hello\"\n\
         max_cost = 1\n",
        codex_profile("done", &[]),
    );
    let file = s.write("batch.toml", &batch);
    let file = file.to_str().expect("utf-8");
    let out = sortie(&s, &["check", file]).output().expect("check");
    let stderr = said(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("task `mystery-task`")
            && stderr.contains("no price for model \"mystery\"")
            && stderr.contains("[prices.\"mystery\"]"),
        "{stderr}"
    );
    assert!(
        stderr.contains("task `default-model`") && stderr.contains("set `model`"),
        "{stderr}"
    );
    let id = unique_run("prices-refused");
    let out = sortie(&s, &["run", "--run-id", &id, file])
        .output()
        .expect("run");
    let run_err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{run_err}");
    assert!(run_err.contains("[prices.\"mystery\"]"), "{run_err}");
    assert!(s.try_events(&id).is_none(), "nothing started");

    // A price for it (and a model) lets the same batch through.
    let priced = batch.replace(
        "[[tasks]]\nlabel = \"default-model\"\nagent = \"done\"\n",
        "[[tasks]]\nlabel = \"default-model\"\nagent = \"done\"\nmodel = \"o3\"\n",
    ) + "\n[prices.\"mystery\"]\ninput = 1\noutput = 4\n";
    let file = s.write("priced.toml", &priced);
    let out = sortie(&s, &["check", file.to_str().expect("utf-8")])
        .output()
        .expect("check");
    let stderr = said(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn prices_a_bad_price_table_is_refused_naming_its_field() {
    let s = Scratch::new();
    let batch = format!(
        "{}[[tasks]]\nlabel = \"t\"\nagent = \"done\"\nmodel = \"m\"\nprompt = \"x\"\n\n\
         [prices.\"m\"]\ninptu = 1\noutput = -2\ncache_read = \"cheap\"\n",
        codex_profile("done", &[]),
    );
    let file = s.write("batch.toml", &batch);
    let out = sortie(&s, &["check", file.to_str().expect("utf-8")])
        .output()
        .expect("check");
    let stderr = said(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for expected in [
        "`prices.\"m\".inptu`: unknown field; did you mean `input`?",
        "`prices.\"m\".output`: expected US dollars per million tokens, at least 0",
        "`prices.\"m\".cache_read`: expected US dollars per million tokens",
    ] {
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
}
