# about: not python at all: exec
# mode: c
# interpreter: sh
# zygote: fallback
# args: ["arg0", "arg1"]
# exit: 3
echo "sh: $0 $1"; exit 3
