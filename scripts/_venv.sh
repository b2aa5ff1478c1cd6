# Sourced by demo.sh and test.sh: create .venv and install amqp-lab with its test extras when
# missing or when pyproject.toml changed since the last install.
venv_python() {
  local root stamp
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  stamp="$root/.venv/.installed"
  if [ ! -x "$root/.venv/bin/python" ]; then
    echo "creating $root/.venv" >&2
    python3 -m venv "$root/.venv" >&2
  fi
  if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    echo "installing amqp-lab and its dependencies into .venv" >&2
    "$root/.venv/bin/pip" install -q --upgrade pip >&2
    "$root/.venv/bin/pip" install -q -e "$root[test]" >&2
    touch "$stamp"
  fi
  echo "$root/.venv/bin/python"
}
