from dpicl.cli import main

main()
