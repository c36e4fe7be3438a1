# about: a stdlib -m module reading stdin (this file is not used: -m json.tool is)
# mode: module
# module: json.tool
# path: -
# stdin: "{\"b\": [1, 2, {\"c\": null}], \"a\": \"é\"}"
# args: ["--sort-keys"]
