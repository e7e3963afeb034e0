//! A claim request's CEL selectors, evaluated against one GPU as Kubernetes' DRA
//! evaluates them: `device.driver`, `device.attributes["<driver>"].<name>` (the attributes
//! gpuplace's driver publishes, from [`gpuplace_model::device_attributes`]: `type`,
//! `index`, `uuid`, `model`, `numaNode`, `nvlinkDomain`, `nvlinkClique`, `pcieSwitch`,
//! `driverVersion`) and `device.capacity["<driver>"].<name>` (`milli`, `memory`), with
//! Kubernetes' `quantity("40Gi")` and `semver("550.54.15")` and their `compareTo`,
//! `isGreaterThan`, `isLessThan` and `asInteger`. A selector that fails on a device (an
//! attribute it lacks) does not match it, with the error kept to explain why.

use std::collections::HashMap;
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::ResolveResult;
use cel::{Context, Env, ExecutionError, Value};
use gpuplace_model::device_attributes::DeviceAttributes;

/// One request's selectors, compiled once.
pub struct Selectors {
    texts: Vec<String>,
    env: Arc<Env>,
    programs: Vec<cel::Program>,
}

impl std::fmt::Debug for Selectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Selectors").field(&self.texts).finish()
    }
}

impl PartialEq for Selectors {
    fn eq(&self, other: &Self) -> bool {
        self.texts == other.texts
    }
}

impl Eq for Selectors {}

/// The most selectors a request may have (the API's limit) and the longest expression
/// gpuplace compiles.
const MAX_SELECTORS: usize = 32;
const MAX_EXPRESSION: usize = 10 * 1024;

impl Selectors {
    /// Compiles `texts`; the error names the selector that does not parse.
    pub fn compile(texts: &[String]) -> Result<Selectors, String> {
        if texts.len() > MAX_SELECTORS {
            return Err(format!(
                "{} selectors, at most {MAX_SELECTORS}",
                texts.len()
            ));
        }
        let env = Arc::new(Env::stdlib());
        let programs = texts
            .iter()
            .map(|t| {
                if t.len() > MAX_EXPRESSION {
                    return Err(format!(
                        "selector of {} bytes, at most {MAX_EXPRESSION}",
                        t.len()
                    ));
                }
                env.compile(t).map_err(|e| {
                    format!(
                        "selector {t:?} does not parse: {}",
                        first_line(&e.to_string())
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Selectors {
            texts: texts.to_vec(),
            env,
            programs,
        })
    }

    /// The selectors' text, as the claim has them.
    pub fn texts(&self) -> &[String] {
        &self.texts
    }

    /// Whether every selector holds for `device` of `driver`; `Err` says which failed and
    /// why (a missing attribute, a wrong type).
    pub fn matches(&self, device: &DeviceAttributes, driver: &str) -> Result<bool, String> {
        let mut ctx = Context::with_env(Arc::clone(&self.env));
        add_functions(&mut ctx);
        ctx.add_variable_from_value("device", device_value(device, driver));
        for (text, program) in self.texts.iter().zip(&self.programs) {
            match program.execute(&ctx) {
                Ok(Value::Bool(true)) => {}
                Ok(Value::Bool(false)) => return Ok(false),
                Ok(other) => {
                    return Err(format!("selector {text:?} gave {other:?}, not a boolean"));
                }
                Err(e) => return Err(format!("selector {text:?}: {e}")),
            }
        }
        Ok(true)
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

fn string(s: &str) -> Value {
    Value::String(Arc::new(s.to_string()))
}

/// `device` as the selectors see it.
fn device_value(d: &DeviceAttributes, driver: &str) -> Value {
    let mut attributes: HashMap<String, Value> = HashMap::new();
    attributes.insert("type".into(), string("gpu"));
    attributes.insert("index".into(), Value::Int(i64::from(d.index)));
    attributes.insert("uuid".into(), string(&d.uuid));
    attributes.insert("model".into(), string(&d.model));
    if let Some(numa) = d.numa_node {
        attributes.insert("numaNode".into(), Value::Int(i64::from(numa)));
    }
    attributes.insert("nvlinkDomain".into(), Value::Int(d.nvlink_domain));
    attributes.insert("nvlinkClique".into(), Value::Int(d.nvlink_clique));
    attributes.insert("pcieSwitch".into(), Value::Int(d.pcie_switch));
    if let Some(v) = &d.driver_version {
        attributes.insert("driverVersion".into(), string(v));
    }
    let mut capacity: HashMap<String, Value> = HashMap::new();
    capacity.insert("milli".into(), Value::Int(i64::from(d.milli)));
    capacity.insert(
        "memory".into(),
        Value::Int(i64::try_from(d.memory_mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX)),
    );
    let mut device: HashMap<String, Value> = HashMap::new();
    device.insert("driver".into(), string(driver));
    device.insert(
        "attributes".into(),
        HashMap::from([(driver.to_string(), Value::from(attributes))]).into(),
    );
    device.insert(
        "capacity".into(),
        HashMap::from([(driver.to_string(), Value::from(capacity))]).into(),
    );
    device.into()
}

/// A quantity in its base unit, rounded up (`40Gi` is 42949672960, `500m` is 1).
fn quantity(text: Arc<String>) -> ResolveResult {
    let milli = gpuplace_model::quantity_milli(&text)
        .map_err(|e| ExecutionError::function_error("quantity", e.to_string()))?;
    let base = milli.div_euclid(1000) + i128::from(milli.rem_euclid(1000) != 0);
    Ok(Value::Int(i64::try_from(base).unwrap_or(i64::MAX)))
}

/// A semantic version (`major.minor.patch`), kept as its text.
fn semver(text: Arc<String>) -> ResolveResult {
    parse_version(&text)
        .map(|_| Value::String(Arc::clone(&text)))
        .ok_or_else(|| {
            ExecutionError::function_error("semver", format!("{text:?} is not a semantic version"))
        })
}

fn parse_version(text: &str) -> Option<(u64, u64, u64)> {
    let core = text.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let v = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(v)
}

/// -1, 0 or 1: quantities (integers here) by value, versions by their numbers.
fn compare(function: &str, a: &Value, b: &Value) -> Result<i64, ExecutionError> {
    let order = match (a, b) {
        (Value::Int(a), Value::Int(b)) => a.cmp(b),
        (Value::String(a), Value::String(b)) => match (parse_version(a), parse_version(b)) {
            (Some(a), Some(b)) => a.cmp(&b),
            _ => {
                return Err(ExecutionError::function_error(
                    function,
                    format!("{a:?} and {b:?} are not versions"),
                ));
            }
        },
        _ => {
            return Err(ExecutionError::function_error(
                function,
                format!("cannot compare {a:?} with {b:?}"),
            ));
        }
    };
    Ok(order as i64)
}

fn add_functions(ctx: &mut Context) {
    // Registration fails only on a name the standard library declares: none of these.
    let _ = ctx.add_function("quantity", quantity);
    let _ = ctx.add_function("semver", semver);
    let _ = ctx.add_function("compareTo", |This(a): This<Value>, b: Value| {
        compare("compareTo", &a, &b).map(Value::Int)
    });
    let _ = ctx.add_function("isGreaterThan", |This(a): This<Value>, b: Value| {
        compare("isGreaterThan", &a, &b).map(|o| Value::Bool(o > 0))
    });
    let _ = ctx.add_function("isLessThan", |This(a): This<Value>, b: Value| {
        compare("isLessThan", &a, &b).map(|o| Value::Bool(o < 0))
    });
    let _ = ctx.add_function("asInteger", |This(a): This<i64>| a);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(model: &str, memory_mib: u64, index: u32) -> DeviceAttributes {
        DeviceAttributes {
            index,
            uuid: format!("GPU-{index}"),
            model: model.into(),
            numa_node: Some(index / 4),
            nvlink_domain: 0,
            nvlink_clique: i64::from(index / 4),
            pcie_switch: 0,
            driver_version: Some("550.54.15".into()),
            memory_mib,
            milli: 1000,
            healthy: true,
        }
    }

    fn sel(text: &str) -> Selectors {
        Selectors::compile(&[text.to_string()]).unwrap()
    }

    #[test]
    fn kubernetes_selectors_match_as_they_do_there() {
        let a100 = gpu("NVIDIA-A100-SXM4-80GB", 81920, 5);
        let v100 = gpu("Tesla-V100-SXM2-16GB", 16160, 1);
        let d = "gpu.gpuplace.io";
        let cases = [
            (
                r#"device.attributes["gpu.gpuplace.io"].model == "NVIDIA-A100-SXM4-80GB""#,
                true,
                false,
            ),
            (
                r#"device.attributes["gpu.gpuplace.io"].model.startsWith("Tesla")"#,
                false,
                true,
            ),
            (
                r#"device.capacity["gpu.gpuplace.io"].memory.compareTo(quantity("40Gi")) >= 0"#,
                true,
                false,
            ),
            (
                r#"device.capacity["gpu.gpuplace.io"].memory.isGreaterThan(quantity("10Gi"))"#,
                true,
                true,
            ),
            (
                r#"device.attributes["gpu.gpuplace.io"].numaNode == 1"#,
                true,
                false,
            ),
            (
                r#"device.attributes["gpu.gpuplace.io"].driverVersion.isGreaterThan(semver("535.0.0"))"#,
                true,
                true,
            ),
            (
                r#"device.driver == "gpu.gpuplace.io" && device.attributes["gpu.gpuplace.io"].index < 4"#,
                false,
                true,
            ),
        ];
        for (text, on_a100, on_v100) in cases {
            let s = sel(text);
            assert_eq!(s.matches(&a100, d), Ok(on_a100), "{text} on the A100");
            assert_eq!(s.matches(&v100, d), Ok(on_v100), "{text} on the V100");
        }
    }

    #[test]
    fn what_cannot_be_evaluated_is_said() {
        let e = Selectors::compile(&["device.attributes[".into()]).unwrap_err();
        assert!(e.contains("does not parse"), "{e}");
        let missing = sel(r#"device.attributes["gpu.gpuplace.io"].color == "red""#);
        let e = missing
            .matches(&gpu("A100", 1, 0), "gpu.gpuplace.io")
            .unwrap_err();
        assert!(e.contains("color"), "{e}");
        let not_bool = sel(r#"device.attributes["gpu.gpuplace.io"].index"#);
        assert!(
            not_bool
                .matches(&gpu("A100", 1, 0), "gpu.gpuplace.io")
                .is_err()
        );
        let bad_quantity =
            sel(r#"device.capacity["gpu.gpuplace.io"].memory.compareTo(quantity("lots")) > 0"#);
        assert!(
            bad_quantity
                .matches(&gpu("A100", 1, 0), "gpu.gpuplace.io")
                .is_err()
        );
    }
}
