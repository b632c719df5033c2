from gputui.launch import main

main()
