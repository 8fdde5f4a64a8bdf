//! Rendering an agent's argv from its profile's template: placeholders substituted in one
//! pass, `{model_args}` expanded when a model is set, and [`expand_element`] for elements an
//! agent's launch plan fills in (such as [`SESSION_ARGS`]).

use std::borrow::Cow;

use sortie_core::AgentProfile;

/// The values substituted into an argv template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vars {
    /// `{prompt}`: the rendered prompt.
    pub prompt: String,
    /// `{model}`: the attempt's model, if any (also decides whether `{model_args}` expands).
    pub model: Option<String>,
    /// `{cwd}`: the attempt's working directory.
    pub cwd: String,
    /// `{attempt}`: the attempt number, from 1.
    pub attempt: u32,
    /// `{label}` (alias `{task}`): the task's label.
    pub label: String,
}

/// Why an argv could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// Neither the profile nor the task gives a command.
    #[error("agent `{agent}` has no command and the task gives none")]
    NoCommand {
        /// The profile's name.
        agent: String,
    },
    /// `{model}` is used outside `{model_args}` but the attempt has no model.
    #[error("argument {element:?} uses {{model}} but the attempt has no model")]
    NoModel {
        /// The template element.
        element: String,
    },
    /// The program name renders to nothing.
    #[error("the program name is empty after rendering {template:?}")]
    EmptyProgram {
        /// The template's first element.
        template: String,
    },
}

/// Renders the argv of an attempt: the task's own `command` when it has one, else the
/// profile's template.
///
/// Placeholders `{prompt}`, `{model}`, `{cwd}`, `{attempt}`, `{label}` and `{task}` are
/// substituted inside elements in one pass (a substituted value is never scanned again); any
/// other brace text is left as is. An element that is exactly `{model_args}` expands to the
/// profile's `model_args` (rendered) when a model is set, and to nothing otherwise. No shell
/// is involved: an element with spaces stays one argument.
pub fn render_argv(
    profile: &AgentProfile,
    task_command: Option<&[String]>,
    vars: &Vars,
) -> Result<Vec<String>, RenderError> {
    let template = task_command.unwrap_or(&profile.command);
    if template.is_empty() {
        return Err(RenderError::NoCommand {
            agent: profile.name.clone(),
        });
    }
    let mut argv = Vec::with_capacity(template.len() + profile.model_args.len());
    for element in template {
        if element == "{model_args}" {
            if vars.model.is_some() {
                for arg in &profile.model_args {
                    argv.push(substitute(arg, vars)?);
                }
            }
        } else {
            argv.push(substitute(element, vars)?);
        }
    }
    match argv.first() {
        Some(program) if !program.is_empty() => Ok(argv),
        _ => Err(RenderError::EmptyProgram {
            template: template[0].clone(),
        }),
    }
}

/// The argv element that expands to an attempt's session arguments (see [`expand_element`]):
/// for a profile that can continue a conversation, where the agent keeps its session and, on a
/// continuation, which session to continue (the agent's launch plan says which arguments).
/// Left alone by [`render_argv`].
pub const SESSION_ARGS: &str = "{session_args}";

/// Replaces every element of a rendered argv that is exactly `placeholder` with `values`
/// (with no values, the element is removed).
pub fn expand_element(argv: Vec<String>, placeholder: &str, values: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len() + values.len());
    for element in argv {
        if element == placeholder {
            out.extend(values.iter().cloned());
        } else {
            out.push(element);
        }
    }
    out
}

/// Substitutes the known placeholders of one element.
fn substitute(element: &str, vars: &Vars) -> Result<String, RenderError> {
    let mut out = String::with_capacity(element.len());
    let mut rest = element;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        if let Some(end) = after.find('}')
            && let Some(value) = placeholder(&after[..end], vars, element)?
        {
            out.push_str(&value);
            rest = &after[end + 1..];
            continue;
        }
        out.push('{');
        rest = after;
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of a placeholder, or None for a name that is not one.
fn placeholder<'a>(
    name: &str,
    vars: &'a Vars,
    element: &str,
) -> Result<Option<Cow<'a, str>>, RenderError> {
    Ok(Some(match name {
        "prompt" => Cow::Borrowed(vars.prompt.as_str()),
        "model" => match &vars.model {
            Some(m) => Cow::Borrowed(m.as_str()),
            None => {
                return Err(RenderError::NoModel {
                    element: element.to_owned(),
                });
            }
        },
        "cwd" => Cow::Borrowed(vars.cwd.as_str()),
        "attempt" => Cow::Owned(vars.attempt.to_string()),
        "label" | "task" => Cow::Borrowed(vars.label.as_str()),
        _ => return Ok(None),
    }))
}
