//! The batch loader's tests of limits and options added since: out-of-range values (file,
//! line, field; 0 is off where documented), the executor and `[slurm]` options, and the run's
//! `[budget]`.

use super::secs;
use crate::*;

#[test]
fn batch_error_out_of_range_values_name_file_line_and_field_and_zero_is_off_where_documented() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bounds.toml");
    std::fs::write(
        &path,
        "concurrency = 5000\n\
         [defaults]\n\
         stall_after = \"0s\"\n\
         stall_kill_after = \"0s\"\n\
         kill_grace = \"0s\"\n\
         grace_turns = 0\n\
         [[tasks]]\n\
         command = [\"true\"]\n\
         max_retries = 1000000\n\
         attempt_timeout = \"1000d\"\n\
         deadline = \"0s\"\n\
         max_turns = 0\n\
         grace_turns = 21\n\
         max_tokens = 0\n\
         max_cost = 0\n\
         stall_after = \"2d\"\n\
         max_orphans = 5000\n",
    )
    .unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let text = err.to_string();
    let got = crate::tests::places(&err);
    assert_eq!(
        got,
        [
            (Some(1), Some("concurrency")),
            (Some(9), Some("max_retries")),
            (Some(10), Some("attempt_timeout")),
            (Some(11), Some("deadline")),
            (Some(12), Some("max_turns")),
            (Some(13), Some("grace_turns")),
            (Some(14), Some("max_tokens")),
            (Some(15), Some("max_cost")),
            (Some(16), Some("stall_after")),
            (Some(17), Some("max_orphans")),
        ],
        "{text}"
    );
    assert!(
        text.contains(
            "bounds.toml:9: field `max_retries`: must be between 0 and 1000 (found 1000000)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "bounds.toml:10: field `attempt_timeout`: must be more than 0 to 7d (found 1000d)"
        ),
        "{text}"
    );
    assert!(
        text.contains("bounds.toml:16: field `stall_after`: must be 0 (off) to 1d (found 2d)"),
        "{text}"
    );
    assert!(
        text.contains(
            "bounds.toml:17: field `max_orphans`: must be between 0 and 1000 (found 5000)"
        ),
        "{text}"
    );
    // The zeros of [defaults] are "off" and accepted: the task with them alone loads.
    std::fs::write(
        &path,
        "[defaults]\nstall_after = \"0s\"\nstall_kill_after = 0\nkill_grace = \"0s\"\n\
         grace_turns = 0\nmax_retries = 0\n[[tasks]]\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let t = &load(&path, None, &Overrides::default())
        .unwrap()
        .batch
        .tasks[0];
    assert_eq!((t.stall_after, t.stall_kill_after), (secs(0), secs(0)));
}

// #11: the executor and the `[slurm]` options.
fn load_text(text: &str, ov: &Overrides) -> Result<Batch, BatchError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.toml");
    std::fs::write(&path, text).unwrap();
    load(&path, None, ov).map(|l| l.batch)
}

#[test]
fn slurm_options_come_from_the_task_then_defaults_and_the_executor_from_the_flag() {
    use sortie_core::{Executor, ExecutorKind, SlurmOptions};
    let text = r#"
[defaults]
executor = "slurm"
command = ["true"]

[defaults.slurm]
partition = "debug"
account = "lab"
mem = "2G"
extra_args = ["--qos=low"]

[[tasks]]
label = "own"
slurm = { partition = "gpu", cpus = 4, mem = 512 }

[[tasks]]
label = "inherits"

[[tasks]]
label = "local"
executor = "local"
"#;
    let b = load_text(text, &Overrides::default()).unwrap();
    assert_eq!(
        b.tasks[0].executor,
        Executor::Slurm(SlurmOptions {
            partition: Some("gpu".into()),
            account: Some("lab".into()),
            cpus: Some(4),
            mem_mb: Some(512),
            extra_args: vec!["--qos=low".into()],
        })
    );
    assert_eq!(
        b.tasks[1].executor,
        Executor::Slurm(SlurmOptions {
            partition: Some("debug".into()),
            account: Some("lab".into()),
            cpus: None,
            mem_mb: Some(2048),
            extra_args: vec!["--qos=low".into()],
        })
    );
    assert_eq!(b.tasks[2].executor, Executor::Local);

    // --executor beats [defaults], a task's own executor beats --executor.
    let local = Overrides {
        executor: Some(ExecutorKind::Local),
        ..Overrides::default()
    };
    let b = load_text(text, &local).unwrap();
    assert_eq!(b.tasks[1].executor, Executor::Local);
    let slurm = Overrides {
        executor: Some(ExecutorKind::Slurm),
        ..Overrides::default()
    };
    let b = load_text(
        "[[tasks]]\ncommand = [\"true\"]\n\n[[tasks]]\ncommand = [\"true\"]\nexecutor = \"local\"\n",
        &slurm,
    )
    .unwrap();
    assert_eq!(b.tasks[0].executor.kind(), ExecutorKind::Slurm);
    assert_eq!(b.tasks[1].executor, Executor::Local);
}

#[test]
fn slurm_problems_name_their_line_and_field() {
    let text = r#"[[tasks]]
command = ["true"]
executor = "kubernetes"

[[tasks]]
command = ["true"]
executor = "slurm"
slurm = { partitoin = "x" }

[[tasks]]
command = ["true"]
[tasks.slurm]
cpus = 0
mem = "lots"
extra_args = ["--exclusive", "--job-name=mine"]
"#;
    let err = load_text(text, &Overrides::default()).unwrap_err();
    let located: Vec<(Option<usize>, Option<String>)> = err
        .issues()
        .iter()
        .map(|i| (i.line, i.field.clone()))
        .collect();
    assert_eq!(
        located,
        [
            (Some(3), Some("executor".into())),
            (Some(8), Some("slurm.partitoin".into())),
            (Some(13), Some("slurm.cpus".into())),
            (Some(14), Some("slurm.mem".into())),
            (Some(15), Some("slurm.extra_args".into())),
        ],
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("expected \"local\", \"slurm\" or \"ray\""),
        "{text}"
    );
    assert!(text.contains("did you mean `partition`?"), "{text}");
    assert!(
        text.contains("\"--job-name=mine\" is set by sortie itself"),
        "{text}"
    );
}

#[test]
fn batch_budget_table_resolves_and_its_problems_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("budget.toml");
    std::fs::write(
        &path,
        "[budget]\nmax_cost = 12.5\nmax_tokens = 1000000\ndeadline = \"2h\"\nwarn_at = 90\n\
         [[tasks]]\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let b = load(&path, None, &Overrides::default()).unwrap().batch;
    assert_eq!(
        b.config.budget,
        sortie_core::RunBudget {
            max_cost_nanos: Some(12_500_000_000),
            max_tokens: Some(1_000_000),
            deadline: Some(secs(7200)),
            warn_percent: 90,
        }
    );
    std::fs::write(
        &path,
        "[budget]\nmax_cost = 0\nwarn_at = 0\ndeadline = \"40d\"\nmax_tokenz = 3\n\
         [[tasks]]\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let got = crate::tests::places(&err);
    assert_eq!(
        got,
        [
            (Some(2), Some("budget.max_cost")),
            (Some(3), Some("budget.warn_at")),
            (Some(4), Some("budget.deadline")),
            (Some(5), Some("budget.max_tokenz")),
        ],
        "{err}"
    );
    assert!(
        err.to_string().contains("did you mean `max_tokens`?"),
        "{err}"
    );
}

/// #36: `[defaults.ray]` and a task's own `ray` table, each key from the task, else the
/// defaults; amounts in thousandths; problems name their line and field.
#[test]
fn ray_options_resolve_from_the_task_then_the_defaults() {
    let text = r#"[defaults]
executor = "ray"

[defaults.ray]
address = "http://head:8265/"
num_cpus = 0.5
runtime_env = { env_vars = { HF_HOME = "/data/hf" } }

[[tasks]]
command = ["true"]
ray = { num_gpus = 1, memory = "1G", resources = { tpu = 2 }, entrypoint_resources = { tpu = 3 } }
"#;
    let b = load_text(text, &Overrides::default()).unwrap();
    let sortie_core::Executor::Ray(o) = &b.tasks[0].executor else {
        panic!("a Ray task: {:?}", b.tasks[0].executor);
    };
    assert_eq!(o.address.as_deref(), Some("http://head:8265"));
    assert_eq!(o.num_cpus, Some(sortie_core::Milli(500)));
    assert_eq!(o.num_gpus, Some(sortie_core::Milli(1000)));
    assert_eq!(o.memory, Some(1 << 30));
    assert_eq!(
        o.all_resources(),
        [("tpu".to_owned(), sortie_core::Milli(3000))]
    );
    assert_eq!(
        o.runtime_env,
        [("HF_HOME".to_owned(), "/data/hf".to_owned())]
    );

    let bad = "[[tasks]]\ncommand = [\"true\"]\nexecutor = \"ray\"\n\
               ray = { address = \"head:8265\", num_gpus = -1, nmu_cpus = 1 }\n";
    let err = load_text(bad, &Overrides::default()).unwrap_err();
    let fields: Vec<Option<String>> = err.issues().iter().map(|i| i.field.clone()).collect();
    assert_eq!(
        fields,
        [
            Some("ray.address".into()),
            Some("ray.num_gpus".into()),
            Some("ray.nmu_cpus".into())
        ],
        "{err}"
    );
    assert!(
        err.to_string().contains("did you mean `num_cpus`?"),
        "{err}"
    );
}
