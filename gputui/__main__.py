from gputui.cli import main

main()
