from sandboxd.cli import main

main()
