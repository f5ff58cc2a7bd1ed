//! Computed columns: the value a table stores for a persisted computed column, from a stored
//! expression ([`Expr`]) or a function the caller supplied.
//!
//! An expression is checked and its column names resolved to positions once, when the table
//! is made ([`Evaluator::new`]); evaluating it per row is then a walk over a few nodes with no
//! lookup and no allocation.

use lastpage_storage::limits::COMPUTED_EXPRESSION_MAX_DEPTH;

use crate::error::{EngineError, Result};
use crate::schema::{ColumnDef, ComputeFn, Computed, Expr};
use crate::types::{DataType, Value};

/// How one computed column is evaluated.
#[derive(Clone)]
pub(crate) enum Evaluator {
    /// A stored expression, its columns resolved to positions.
    Expression(Resolved),
    /// A function the caller supplied.
    Function(ComputeFn),
}

/// An [`Expr`] whose columns are positions in the row.
#[derive(Clone, Debug)]
pub(crate) enum Resolved {
    /// A column's position, with its type and name (to convert its value, and to name it in
    /// the conversion's error).
    Column {
        position: usize,
        data_type: DataType,
        name: String,
    },
    Integer(i64),
    Modulo(Box<Resolved>, Box<Resolved>),
    /// `ABS(operand)`, and whether the operand is a `bigint` (else an `int`: see
    /// [`Resolved::is_bigint`]), the type its result must fit.
    Abs(Box<Resolved>, bool),
}

impl Evaluator {
    /// The evaluator of `computed`, the computation of a column of a table whose columns are
    /// `columns`; an expression that nests too deeply or reads a column that is missing or not
    /// an integer is refused, with the reason.
    pub(crate) fn new(
        computed: &Computed,
        columns: &[ColumnDef],
    ) -> std::result::Result<Evaluator, String> {
        match computed {
            Computed::Function(function) => Ok(Evaluator::Function(function.clone())),
            Computed::Expression(expr) => {
                if expr.depth() > COMPUTED_EXPRESSION_MAX_DEPTH {
                    return Err(format!(
                        "its expression nests {} levels deep, more than the \
                         {COMPUTED_EXPRESSION_MAX_DEPTH} allowed",
                        expr.depth()
                    ));
                }
                resolve(expr, columns).map(Evaluator::Expression)
            }
        }
    }
}

fn resolve(expr: &Expr, columns: &[ColumnDef]) -> std::result::Result<Resolved, String> {
    Ok(match expr {
        Expr::Column(name) => {
            let Some(position) = columns
                .iter()
                .position(|column| column.name.eq_ignore_ascii_case(name))
            else {
                return Err(format!(
                    "its expression reads column '{name}', which does not exist"
                ));
            };
            let data_type = columns[position].data_type;
            if !matches!(
                data_type,
                DataType::TinyInt | DataType::SmallInt | DataType::Int | DataType::BigInt
            ) {
                return Err(format!(
                    "its expression reads column '{name}' of type {}, not an integer",
                    data_type.name()
                ));
            }
            Resolved::Column {
                position,
                data_type,
                name: columns[position].name.clone(),
            }
        }
        Expr::Integer(value) => Resolved::Integer(*value),
        Expr::Modulo(left, right) => Resolved::Modulo(
            Box::new(resolve(left, columns)?),
            Box::new(resolve(right, columns)?),
        ),
        Expr::Abs(operand) => {
            let operand = resolve(operand, columns)?;
            let bigint = operand.is_bigint();
            Resolved::Abs(Box::new(operand), bigint)
        }
    })
}

impl Resolved {
    /// Whether the expression is a `bigint` in T-SQL, rather than an `int`: a `bigint` column,
    /// a constant outside the `int` range, a `%` with a `bigint` operand (the type of higher
    /// precedence), or `ABS` of a `bigint`. `ABS` of an `int`, `smallint` or `tinyint` is an
    /// `int`, and so is a `%` of those (a `tinyint % tinyint`, a `tinyint` in T-SQL, always
    /// fits an `int`).
    fn is_bigint(&self) -> bool {
        match self {
            Resolved::Column { data_type, .. } => *data_type == DataType::BigInt,
            Resolved::Integer(value) => i32::try_from(*value).is_err(),
            Resolved::Modulo(left, right) => left.is_bigint() || right.is_bigint(),
            Resolved::Abs(_, bigint) => *bigint,
        }
    }

    /// The expression's value for the row `values` (a `bigint`, or NULL if an operand is).
    pub(crate) fn evaluate(&self, values: &[Value]) -> Result<Value> {
        Ok(self.integer(values)?.map_or(Value::Null, Value::BigInt))
    }

    fn integer(&self, values: &[Value]) -> Result<Option<i64>> {
        Ok(match self {
            Resolved::Column {
                position,
                data_type,
                name,
            } => {
                // The value the row stores, converted to its column's type, as T-SQL computes
                // a persisted column from the row it stores. The row's values are converted
                // only after the computed columns are evaluated, and text, a decimal or money
                // given for an integer column has no integer as supplied: read as it was, it
                // made the result NULL beside a row that holds the integer. A value of the
                // column's own type (the usual case) is read as it is, with no conversion.
                let value = &values[*position];
                if data_type.holds_as_is(value) {
                    value.as_i64()
                } else {
                    data_type
                        .coerce(value.clone())
                        .map_err(|error| error.with_column(name))?
                        .as_i64()
                }
            }
            Resolved::Integer(value) => Some(*value),
            Resolved::Modulo(left, right) => {
                let (Some(left), Some(right)) = (left.integer(values)?, right.integer(values)?)
                else {
                    return Ok(None);
                };
                if right == 0 {
                    return Err(EngineError::DivideByZero);
                }
                // `i64::MIN % -1` is 0, as in T-SQL; `%` itself would overflow.
                Some(left.wrapping_rem(right))
            }
            // T-SQL's ABS returns an `int` for an `int` operand, so the absolute value of the
            // smallest `int` overflows even when the column stores a `bigint` (reading every
            // operand as a `bigint` stored 2147483648 there instead of failing).
            Resolved::Abs(operand, bigint) => match operand.integer(values)? {
                None => None,
                Some(value) => {
                    let fits = if *bigint {
                        value.checked_abs()
                    } else {
                        value
                            .checked_abs()
                            .filter(|&absolute| absolute <= i64::from(i32::MAX))
                    };
                    Some(fits.ok_or_else(|| EngineError::ArithmeticOverflow {
                        data_type: if *bigint { "bigint" } else { "int" }.into(),
                    })?)
                }
            },
        })
    }
}
