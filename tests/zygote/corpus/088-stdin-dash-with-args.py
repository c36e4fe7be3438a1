# about: python3 - with args: stdin is the program
# mode: stdin-dash
# args: ["one", "--two"]
import sys
print(sys.argv, sys.stdin.read() == '')
