//! #36: a task's (or `[defaults]`'s) `ray` table, type-checked into a [`RawRay`]: the job API's
//! address and the entrypoint's resources and environment variables.

use sortie_core::Milli;

use crate::error::Issues;
use crate::fields::{RawTask, expected, string, suggest};
use crate::value::{Entry, Val};

/// The keys of a `ray` table (#36).
pub(crate) const RAY_FIELDS: &[&str] = &[
    "address",
    "num_cpus",
    "num_gpus",
    "memory",
    "resources",
    "entrypoint_resources",
    "runtime_env",
];

/// A `ray` table's fields, type-checked; each is picked from the task, then `[defaults]`.
#[derive(Default, Clone)]
pub(crate) struct RawRay {
    pub(crate) address: Option<String>,
    pub(crate) num_cpus: Option<Milli>,
    pub(crate) num_gpus: Option<Milli>,
    pub(crate) memory: Option<u64>,
    pub(crate) resources: Option<Vec<(String, Milli)>>,
    pub(crate) entrypoint_resources: Option<Vec<(String, Milli)>>,
    pub(crate) runtime_env: Option<Vec<(String, String)>>,
}

impl RawTask {
    /// `{ address, num_cpus, num_gpus, memory, resources, entrypoint_resources, runtime_env }`,
    /// any of them; each sub-field's problem is its own issue.
    pub(crate) fn parse_ray(&mut self, e: &Entry, issues: &mut Issues) -> Result<(), String> {
        let Val::Table(entries) = &e.val else {
            return Err(expected("a table { address, num_cpus, ... }", &e.val));
        };
        for sub in entries {
            let field = format!("ray.{}", sub.key);
            let v = &sub.val;
            let o = &mut self.ray;
            let parsed = match sub.key.as_str() {
                _ if matches!(v, Val::Null) => Ok(()),
                "address" => address(v).map(|a| o.address = Some(a)),
                "num_cpus" => amount(v).map(|a| o.num_cpus = Some(a)),
                "num_gpus" => amount(v).map(|a| o.num_gpus = Some(a)),
                "memory" => bytes(v).map(|b| o.memory = Some(b)),
                "resources" => amounts(v).map(|r| o.resources = Some(r)),
                "entrypoint_resources" => amounts(v).map(|r| o.entrypoint_resources = Some(r)),
                "runtime_env" => env_vars(v).map(|r| o.runtime_env = Some(r)),
                _ => Err(format!("unknown field{}", suggest(&sub.key, RAY_FIELDS))),
            };
            if let Err(message) = parsed {
                issues.add(&self.file, sub.line, Some(&field), message);
                self.failed.insert("ray");
            }
        }
        Ok(())
    }
}

/// `address`: the job API's `http://host:port` (no TLS: a head node's dashboard port).
fn address(v: &Val) -> Result<String, String> {
    let a = string(v)?;
    let a = a.trim().trim_end_matches('/').to_owned();
    match a.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() && !rest.contains(char::is_whitespace) => Ok(a),
        _ => Err(format!(
            "expected the job API's address, such as \"http://127.0.0.1:8265\", found {a:?}"
        )),
    }
}

/// A resource amount: a non-negative number, kept in thousandths.
fn amount(v: &Val) -> Result<Milli, String> {
    let n = match v {
        Val::Int(i) => *i as f64,
        Val::Float(f) => *f,
        other => return Err(expected("a number", other)),
    };
    if !n.is_finite() || !(0.0..=1e12).contains(&n) {
        return Err(format!("expected a number from 0 up, found {n}"));
    }
    Ok(Milli((n * 1000.0).round() as u64))
}

/// `memory`: bytes, as an integer or a size with a unit (`"512M"`, `"8G"`, powers of 1024).
fn bytes(v: &Val) -> Result<u64, String> {
    const MSG: &str = "expected bytes or a size such as \"512M\" or \"8G\"";
    let b = match v {
        Val::Int(i) => u64::try_from(*i).ok(),
        Val::Str(s) => {
            let s = s.trim();
            let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (n, unit) = s.split_at(split);
            let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
                "" | "B" => 1,
                "K" | "KB" => 1 << 10,
                "M" | "MB" => 1 << 20,
                "G" | "GB" => 1 << 30,
                "T" | "TB" => 1 << 40,
                _ => return Err(format!("{MSG}, found {s:?}")),
            };
            n.parse::<u64>().ok().and_then(|n| n.checked_mul(scale))
        }
        other => return Err(format!("{MSG}, found {}", other.kind())),
    };
    b.ok_or_else(|| format!("{MSG}, found {}", v.kind()))
}

/// A table of resource names to amounts.
fn amounts(v: &Val) -> Result<Vec<(String, Milli)>, String> {
    let Val::Table(entries) = v else {
        return Err(expected("a table of resource names to amounts", v));
    };
    entries
        .iter()
        .map(|e| match amount(&e.val) {
            Ok(a) if !e.key.trim().is_empty() => Ok((e.key.clone(), a)),
            Ok(_) => Err("a resource needs a name".to_owned()),
            Err(m) => Err(format!("{}: {m}", e.key)),
        })
        .collect()
}

/// `runtime_env`: `{ env_vars = { NAME = "value" } }`, or the variables themselves.
fn env_vars(v: &Val) -> Result<Vec<(String, String)>, String> {
    let Val::Table(entries) = v else {
        return Err(expected("a table { env_vars = { NAME = \"value\" } }", v));
    };
    let vars = match entries.as_slice() {
        [only] if only.key == "env_vars" => &only.val,
        _ => v,
    };
    let Val::Table(vars) = vars else {
        return Err(expected("a table of variables", vars));
    };
    vars.iter()
        .map(|e| {
            if e.key.contains('=') || e.key.is_empty() || e.key.contains('\0') {
                return Err(format!("{:?} cannot be a variable's name", e.key));
            }
            string(&e.val)
                .map(|s| (e.key.clone(), s))
                .map_err(|m| format!("{}: {m}", e.key))
        })
        .collect()
}
