from kwdiag.cli import main

main()
